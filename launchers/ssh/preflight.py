"""Pre-flight: check every host in parallel before anything starts anywhere, print one table.

On each host a small Python program (run by the configured ``ssh.python``) reports: its Python
version, whether tflaunch imports, the TensorFlow version (found without importing TensorFlow,
which would cost seconds per host), the GPUs ``nvidia-smi`` lists (none without it), whether the
planned ports can be bound, whether the cluster address is one of the host's own, and whether the
working directory and the program exist. Any problem on any host is one LaunchError (exit 2)
listing every problem, raised before a single agent is started.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import paramiko

from tflaunch.launchers.ssh.connect import CommandResult, Connection, remote_command
from tflaunch.plugin import LaunchError, Plan, render_task
from tflaunch.text import aligned

# Runs on the host; its only input is one JSON argument, its only output one JSON line.
PROBE = r"""
import importlib.util, json, os, shutil, socket, subprocess, sys
req = json.loads(sys.argv[1])
out = {"python": sys.version.split()[0], "problems": [], "home": os.getcwd()}

# The run directory and its files (the plan, ...), given on stdin: no SFTP round trips needed.
if req.get("run_dir"):
    run_dir = os.path.normpath(os.path.join(os.getcwd(), os.path.expanduser(req["run_dir"])))
    try:
        os.makedirs(run_dir, exist_ok=True)
        if req.get("run_dir_mode") is not None:
            for private in (os.path.dirname(run_dir), run_dir):
                os.chmod(private, req["run_dir_mode"])
        files = json.loads(sys.stdin.readline()) if req.get("files_on_stdin") else {}
        for name, text in files.items():
            fd = os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        out["run_dir"] = run_dir
    except OSError as err:
        out["problems"].append("cannot write the run directory %s (%s)" % (run_dir, err))

def has_module(name, path=None):
    old = list(sys.path)
    if path:
        sys.path.insert(0, path)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = old
    # An empty directory is a namespace package: not an installed module.
    return spec is not None and spec.origin not in (None, "namespace")

try:
    import tflaunch
    out["tflaunch"] = getattr(tflaunch, "__version__", "?")
except Exception as err:
    out["tflaunch"] = None
    out["problems"].append("tflaunch does not import with %s (%s: %s); install it there "
                           "(pip install tflaunch)" % (sys.executable, type(err).__name__, err))

out["tensorflow"] = None
if has_module("tensorflow"):
    from importlib import metadata
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly",
                 "tensorflow-macos", "intel-tensorflow"):
        try:
            out["tensorflow"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    else:
        out["tensorflow"] = "unknown version"

try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    out["gpus"] = len([l for l in smi.stdout.splitlines() if l.strip()]) if smi.returncode == 0 else 0
except (OSError, subprocess.SubprocessError):
    out["gpus"] = 0

try:
    probe = socket.socket()
    probe.bind((req["address"], 0))
    probe.close()
except OSError as err:
    out["problems"].append("the cluster address %s is not an address of this host (%s); "
                           "use its private address" % (req["address"], err.strerror))

busy = []
for port in req["ports"]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError:
        busy.append(port)
    finally:
        sock.close()
out["busy_ports"] = busy

workdir = os.path.abspath(os.path.expanduser(req["workdir"]))
out["workdir"] = workdir
argv = req["argv"]
if not os.path.isdir(workdir):
    out["program"] = None
    out["problems"].append("the working directory %s does not exist" % workdir)
else:
    os.chdir(workdir)
    program = argv[0]
    found = os.path.exists(program) if os.sep in program else shutil.which(program)
    out["program"] = program if found else None
    if not found:
        out["problems"].append("the program %r is not found in %s" % (program, workdir))
    elif os.path.basename(program).startswith("python") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            if not has_module(argv[2], workdir):
                out["program"] = None
                out["problems"].append("module %s is not found from %s" % (argv[2], workdir))
            else:
                out["program"] = "-m " + argv[2]
        elif not argv[1].startswith("-"):
            if not os.path.isfile(argv[1]):
                out["program"] = None
                out["problems"].append("the script %s is not in %s" % (argv[1], workdir))
            else:
                out["program"] = argv[1]
print(json.dumps(out), flush=True)

# Kept (an attached run): wait for the launcher's verdict on every host, then become this host's
# agent in this very process, on this channel -- no second command, shell or interpreter.
if req.get("then_agent"):
    try:
        import tflaunch.launchers.agent  # while the other hosts are checked
    except Exception:
        pass  # the verdict has seen the problem already
    line = sys.stdin.readline()
    command = json.loads(line) if line.strip() else {}
    if command.get("agent"):
        from tflaunch.launchers.agent import main as agent_main
        sys.exit(agent_main(command["agent"]))
"""


@dataclasses.dataclass
class HostReport:
    """What pre-flight found on one host, and every problem with it."""

    host: str
    connect_address: str
    cluster_address: str
    facts: dict[str, Any]
    problems: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)


def probe_request(
    plan: Plan,
    host: str,
    workdir: str,
    run_dir: str | None = None,
    files: bool = False,
    then_agent: bool = False,
    mode: int | None = None,
) -> dict[str, Any]:
    """The probe's input for one host: its cluster address, planned ports, workdir, program;
    the run directory to make, with ``files`` to write there coming as one line on stdin; and
    whether it then waits to become the host's agent."""
    tasks = plan.tasks_on(host)
    return {
        "run_dir": run_dir,
        "run_dir_mode": mode,
        "files_on_stdin": files,
        "then_agent": then_agent,
        "address": plan.host(host).cluster_address,
        "ports": sorted({t.port for t in tasks if t.port is not None}),
        "workdir": workdir,
        # what the probe looks at: the program, and a script or "-m module" after it
        "argv": list(render_task(plan, tasks[0]).argv[:3]) if tasks else [],
    }


def check_host(
    conn: Connection,
    plan: Plan,
    python: str,
    workdir: str,
    timeout: float = 60.0,
    run_dir: str | None = None,
    files: Mapping[str, str] | None = None,
    mode: int | None = None,
) -> HostReport:
    """Run the probe on one host and judge what it found. With ``run_dir`` (absolute, ``~/...``
    or relative to the remote home) the probe also makes that directory and writes ``files``
    into it, in the same round trip."""
    request = probe_request(plan, conn.name, workdir, run_dir, files is not None, mode=mode)
    stdin = (json.dumps(dict(files)) + "\n").encode() if files is not None else b""
    command = remote_command([python, "-c", PROBE, json.dumps(request)])
    return _report(conn.name, plan, python, conn.run(command, timeout=timeout, stdin=stdin))


def start_host_check(
    conn: Connection,
    plan: Plan,
    python: str,
    workdir: str,
    run_dir: str,
    files: Mapping[str, str],
    timeout: float = 60.0,
    mode: int | None = None,
) -> tuple[HostReport, paramiko.Channel]:
    """``check_host`` whose probe then waits on its channel to become the host's agent: send
    ``{"agent": [agent arguments]}`` to start it, or close the channel to end it."""
    request = probe_request(
        plan, conn.name, workdir, run_dir, files=True, then_agent=True, mode=mode
    )
    channel = conn.start(remote_command([python, "-c", PROBE, json.dumps(request)]))
    channel.sendall((json.dumps(dict(files)) + "\n").encode())
    line = _first_line(channel, conn.name, time.monotonic() + timeout)
    if line:
        result = CommandResult(0, line, "")
    else:  # the probe ended without a word: its exit status and stderr say why
        deadline = time.monotonic() + 10
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        stderr = bytearray()
        while channel.recv_stderr_ready():
            stderr += channel.recv_stderr(65536)
        status = channel.recv_exit_status() if channel.exit_status_ready() else 1
        result = CommandResult(status or 1, "", stderr.decode(errors="replace"))
    return _report(conn.name, plan, python, result), channel


def _first_line(channel: paramiko.Channel, host: str, deadline: float) -> str:
    """The probe's result line; byte by byte: what follows belongs to the agent's stream."""
    data = bytearray()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LaunchError(f"{host}: the pre-flight probe did not answer in time.")
        channel.settimeout(remaining)
        try:
            chunk = channel.recv(1)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _report(name: str, plan: Plan, python: str, result: CommandResult) -> HostReport:
    host = plan.host(name)
    report = HostReport(name, host.connect_address, host.cluster_address, {}, [])
    if result.exit_status != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        if result.exit_status == 127:
            detail = f"'{python}' is not found there; set ssh.python to its Python interpreter"
        report.problems.append(f"the pre-flight probe failed (exit {result.exit_status}): {detail}")
        return report
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.problems.append(f"the pre-flight probe printed no result: {result.stdout[-200:]!r}")
        return report
    report.facts = facts
    report.problems.extend(facts.get("problems", []))
    judge(report, plan, python)
    return report


def judge(report: HostReport, plan: Plan, python: str) -> None:
    """Turn the facts into problems: TensorFlow missing, ports busy, too few GPUs."""
    facts = report.facts
    tasks = plan.tasks_on(report.host)
    if not facts.get("tensorflow"):
        report.problems.append(
            f"TensorFlow is not installed for {python} (pip install tensorflow there, or set "
            "ssh.python to the interpreter that has it)"
        )
    for port in facts.get("busy_ports", []):
        users = ", ".join(t.name for t in tasks if t.port == port)
        report.problems.append(
            f"port {port} (planned for {users}) is already in use; stop what holds it "
            f"(ss -ltnp 'sport = :{port}') or change the base ports under 'ports:'"
        )
    wanted = sorted({int(g) for t in tasks for g in t.gpus if g.isdigit()})
    if wanted and wanted[-1] >= int(facts.get("gpus", 0)):
        report.problems.append(
            f"the plan uses GPU(s) {', '.join(map(str, wanted))} but nvidia-smi lists "
            f"{facts.get('gpus', 0)}; fix the host's 'gpus' in the cluster file"
        )
    host_gpus = int(facts.get("gpus", 0))
    host = plan.host(report.host)
    if host_gpus and not host.gpu_ids and host.gpu_source:
        report.warnings.append(
            f"nvidia-smi lists {host_gpus} GPU(s) but the cluster file gives the host 0 "
            f"({host.gpu_source}), so its tasks run on CPU; leave its gpus out to use them"
        )


COLUMNS = (
    "HOST",
    "CONNECT",
    "CLUSTER",
    "PYTHON",
    "TFLAUNCH",
    "TENSORFLOW",
    "GPUS",
    "PORTS",
    "PROGRAM",
    "CHECK",
)


def _row(report: HostReport, plan: Plan) -> tuple[str, ...]:
    facts = report.facts
    ports = sorted({t.port for t in plan.tasks_on(report.host) if t.port is not None})
    busy = set(facts.get("busy_ports", []))
    port_text = ",".join(f"{p}{'(busy)' if p in busy else ''}" for p in ports) or "-"
    return (
        report.host,
        report.connect_address,
        report.cluster_address,
        facts.get("python") or "?",
        facts.get("tflaunch") or "MISSING",
        facts.get("tensorflow") or "MISSING",
        str(facts.get("gpus", "?")),
        port_text if facts else "?",
        facts.get("program") or "MISSING",
        "ok" if not report.problems else f"{len(report.problems)} problem(s)",
    )


def format_table(reports: Sequence[HostReport], plan: Plan) -> str:
    """One table, one row per host."""
    rows = [COLUMNS, *(_row(r, plan) for r in reports)]
    return "\n".join(aligned(rows))


def warnings(reports: Sequence[HostReport]) -> list[str]:
    """What is worth knowing but does not stop the run (GPUs the plan leaves unused)."""
    return [f"{r.host}: {w}" for r in reports for w in r.warnings]


def raise_on_problems(reports: Sequence[HostReport]) -> None:
    """One LaunchError naming every problem on every host, or nothing."""
    problems = [f"{r.host} ({r.connect_address}): {p}" for r in reports for p in r.problems]
    if problems:
        raise LaunchError(
            f"pre-flight failed on {len({r.host for r in reports if r.problems})} of "
            f"{len(reports)} hosts; nothing was started.\n  " + "\n  ".join(problems)
        )
