"""The watchdog that provisioned instances run from their user data: it powers the machine off
(which EC2 turns into termination) at the runtime limit or after the idle timeout. Run here with
a stand-in ``shutdown`` on PATH and an activity pattern of the test's own."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tflaunch.launchers.clouds.watchdog import user_data, watchdog_script


def fake_shutdown(tmp_path: Path) -> tuple[dict, Path]:
    bin_dir, record = tmp_path / "bin", tmp_path / "shutdown-called"
    bin_dir.mkdir()
    (bin_dir / "shutdown").write_text(f'#!/bin/sh\necho "$@" > {record}\n')
    (bin_dir / "shutdown").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, record


def watch(tmp_path: Path, script: str, env: dict) -> subprocess.CompletedProcess:
    """Run the watchdog as the user data does: from a file (so its own command line is short)."""
    path = tmp_path / "watchdog.sh"
    path.write_text(script)
    return subprocess.run(["sh", str(path)], env=env, capture_output=True, text=True, timeout=30)


def busy(marker: str, seconds: float) -> subprocess.Popen:
    """A process whose command line the watchdog counts as activity."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", marker])


@pytest.mark.slow
def test_idle_timeout_counts_from_the_last_activity(tmp_path):
    env, record = fake_shutdown(tmp_path)
    marker = f"wd-{uuid.uuid4().hex}"
    activity = busy(marker, 4)
    # "[w]d-..." matches the busy process but not the grep that looks for it.
    script = watchdog_script(None, idle_timeout=3, step=1, activity=f"[w]{marker[1:]}")
    started = time.monotonic()
    done = watch(tmp_path, script, env)
    elapsed = time.monotonic() - started
    activity.wait()
    assert record.read_text().split() == ["-h", "now"]
    assert "idle for 3 s" in done.stdout
    # 4 s busy, then 3 s idle, less a step (1 s) and the whole-second clock (1 s): at least 5 s;
    # a watchdog that ignored the activity would stop after about 3 s.
    assert elapsed >= 4.5


@pytest.mark.slow
def test_max_runtime_ends_a_busy_machine(tmp_path):
    env, record = fake_shutdown(tmp_path)
    marker = f"wd-{uuid.uuid4().hex}"
    activity = busy(marker, 30)
    try:
        script = watchdog_script(2, idle_timeout=600, step=1, activity=f"[w]{marker[1:]}")
        done = watch(tmp_path, script, env)
    finally:
        activity.kill()
    assert "reached supervision.max_runtime (2 s)" in done.stdout
    assert record.exists()


def test_user_data_installs_and_starts_the_watchdog():
    data = user_data(max_runtime=3600, idle_timeout=900)
    assert data.startswith("#!/bin/sh\n")
    assert "MAX_RUNTIME=3600\nIDLE_TIMEOUT=900\n" in data
    assert "nohup sh /var/run/tflaunch-watchdog.sh" in data
