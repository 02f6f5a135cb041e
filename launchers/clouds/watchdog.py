"""The watchdog every provisioned instance runs from its user data: it powers the machine off at
``supervision.max_runtime`` and after ``ssh.provision.idle_timeout`` seconds without a tflaunch
process or SSH session. Providers create instances whose power-off is termination, so a
forgotten run (or kept cluster) ends even if the laptop that started it is gone."""

from __future__ import annotations

# Processes that count as activity: an agent or coordinator of tflaunch, or an SSH session.
ACTIVITY = r"[t]flaunch[.](agent|launchers)|^sshd: [^ ]+@"

WATCHDOG = """\
start=$(date +%s); last=$start
while :; do
  now=$(date +%s)
  if ps -eo args= | grep -Eq "$ACTIVITY"; then last=$now; fi
  if [ "$MAX_RUNTIME" -gt 0 ] && [ $((now - start)) -ge "$MAX_RUNTIME" ]; then
    why="reached supervision.max_runtime ($MAX_RUNTIME s)"; break
  fi
  if [ $((now - last)) -ge "$IDLE_TIMEOUT" ]; then
    why="idle for $IDLE_TIMEOUT s (ssh.provision.idle_timeout)"; break
  fi
  sleep "$STEP"
done
echo "tflaunch watchdog: $why; powering off"
shutdown -h now
"""


def watchdog_script(
    max_runtime: float | None, idle_timeout: float, step: float = 30, activity: str = ACTIVITY
) -> str:
    """The watchdog loop (POSIX sh) with its settings; it powers the machine off when done."""
    settings = (
        f"MAX_RUNTIME={int(max_runtime or 0)}\nIDLE_TIMEOUT={int(idle_timeout)}\n"
        f"STEP={max(1, int(step))}\nACTIVITY='{activity}'\n"
    )
    return settings + WATCHDOG


def user_data(max_runtime: float | None, idle_timeout: float) -> str:
    """Instance user data: install the watchdog and start it in the background at boot."""
    script = watchdog_script(max_runtime, idle_timeout)
    return (
        "#!/bin/sh\n# tflaunch: terminate this instance at its runtime limit or when idle\n"
        "cat > /var/run/tflaunch-watchdog.sh <<'TFLAUNCH_EOF'\n"
        f"{script}TFLAUNCH_EOF\n"
        "nohup sh /var/run/tflaunch-watchdog.sh >/var/log/tflaunch-watchdog.log 2>&1 &\n"
    )
