"""Fuzz the cluster-file reader: mutated files through validate, plan, render and up --dry-run.

Each generated file runs in a forked child under a memory limit (RLIMIT_AS: what the child had
at fork plus --memory-mib), through the CLI in-process (click's CliRunner). The promise for bad
input is one paragraph and exit code 2, so the report counts exit codes, and lists Python
tracebacks, invocations over --seconds of CPU time and those that ran out of memory or grew past
the limit. CPU time, not wall time: on a loaded machine a 5 ms parse can take seconds of wall time
(the child descheduled), and a verdict from that would be the machine's, not the reader's.

    python tests/fuzz_config.py --seed 1 --count 3000

Exit status 1 when any traceback, slow or oversized invocation was found. Seeds are the example
and golden cluster files (EC2 discovery replaced by inline hosts: the fuzz must not reach AWS).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import io
import json
import os
import random
import resource
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SEED_FILES = [
    *sorted((ROOT / "examples").glob("*.yaml")),
    *sorted((ROOT / "tests" / "golden" / "plan").glob("*.yaml")),
]

# Values that broke, or could break, something once: huge and odd numbers, YAML 1.1 traps,
# control characters, placeholders with format specs, shell, and wrong shapes.
NASTY_SCALARS = [
    0, -1, 1, 2, 3, 7, 64, 4096, 4097, 65535, 65536, 10**6, 10**9, 10**18, 10**400,
    0.0, 0.05, 1e308, -1e308, float("inf"), float("-inf"), float("nan"),
    True, False, None, "", " ", "0", "0123", "1:00:00", "30:00", "1e9", "0x10",
    "a\nb", "a\rb", "a\0b", "\x1b[31m", "é", "\u2028", "{job_name:d}", "{task_index!r}",
    "{", "}", "{}", "{0}", "{port}", "{worker_hosts}", "{host.x}", "X; touch pwned #",
    "A=B", "--split-string=id", "$(id)", "`id`", "'", '"', "\\", "%j", "~", "/", "..",
    "-" * 200, "x" * 5000, "2-12:00:00", "UNLIMITED", "0700", "0777", "rwx",
    "gpu:2", "gpu:p100:1", "gpu", "gpu:x", "--export=NONE", "dedicated", "colocated",
    "local", "slurm", "ssh", "strict", "accept-new",
]  # fmt: skip
NASTY_TEXT_LINES = [
    "slurm:\n  time: 1:00:00",
    "slurm: {account: 0123}",
    "roles: {worker: 1000000}",
    "hosts: [{name: a, gpus: 1000000000}]",
    "slurm: {gpus_per_node: 10000000}",
    "supervision: {grace_period: .inf}",
    "supervision: {heartbeat: 30}",
    "ssh: {port: 99999}",
    "program: {argv: [p, '{job_name:d}']}",
    'program: {argv: [p, "a\\0b"], env: {"X; touch pwned #": 1}}',
    "x: &a [*a]",
    "<<: {name: merged}",
    "name: !!python/object:os.system ls",
    "name: !!binary aGVsbG8=",
    "? [a, b]\n: c",
    "---\nname: second",
    "%YAML 1.1\n---",
    "\t- tab",
    "name: 'unterminated",
]
TEXT_GARBAGE = [b"\xff", b"\xc3", b"\x00", b"\x01", b"\x7f", b"\xef\xbb\xbf", b"\r", b"\x85"]


def _schema_keys() -> dict[str, list[str]]:
    """Valid keys per section, from the JSON Schema (so new keys get fuzzed too)."""
    from tflaunch.cluster.config import config_schema

    keys: dict[str, list[str]] = {}

    def walk(node: dict, name: str) -> None:
        for option in node.get("anyOf", [node]):
            props = option.get("properties")
            if props:
                keys[name] = sorted(props)
                for key, sub in props.items():
                    walk(sub, key)

    walk(config_schema(), "")
    return keys


def _seeds() -> list[dict]:
    seeds = []
    for path in SEED_FILES:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict) or "program" not in data:
            continue  # a sweep file, not a cluster file
        ssh = data.get("ssh") or {}
        if "ec2" in ssh:
            del ssh["ec2"]
            data["hosts"] = [
                {"name": f"gpu{i}", "connect": f"203.0.113.{i}", "address": f"10.0.0.{i}"}
                for i in range(1, 5)
            ]
        seeds.append(data)
    return seeds


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _get(data, path):
    for part in path:
        data = data[part]
    return data


def _mutate_data(rng: random.Random, data: dict, keys: dict[str, list[str]]) -> dict:
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 4)):
        paths = [p for p in _paths(data) if p]
        path = rng.choice(paths)
        parent = _get(data, path[:-1])
        action = rng.random()
        if action < 0.5:
            parent[path[-1]] = rng.choice(NASTY_SCALARS)
        elif action < 0.6:
            del parent[path[-1]]
        elif action < 0.7:
            parent[path[-1]] = rng.choice([[], {}, [rng.choice(NASTY_SCALARS)], {"x": 1}])
        elif action < 0.85 and isinstance(parent, dict):
            section = str(path[-2]) if len(path) > 1 else ""
            key = rng.choice(keys.get(section) or keys[""])
            parent[key] = rng.choice(NASTY_SCALARS)
        elif isinstance(parent, list):
            parent.extend(copy.deepcopy(parent) * rng.randint(1, 3))
        else:
            parent[path[-1]] = copy.deepcopy(_get(data, rng.choice(paths)))
    return data


def _dump(data: dict) -> bytes:
    try:
        return yaml.safe_dump(data, allow_unicode=True, width=10**6).encode()
    except (yaml.YAMLError, ValueError, OverflowError):
        return json.dumps(data, default=str).encode()  # JSON is YAML


def _mutate_text(rng: random.Random, raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    for _ in range(rng.randint(1, 3)):
        action = rng.random()
        at = rng.randrange(len(lines) + 1)
        if action < 0.35:
            lines[at:at] = rng.choice(NASTY_TEXT_LINES).encode().split(b"\n")
        elif action < 0.5 and lines:
            lines.insert(at, lines[min(at, len(lines) - 1)])  # a duplicate key, often
        elif action < 0.6 and len(lines) > 1:
            del lines[min(at, len(lines) - 1)]
        elif action < 0.75 and lines:
            i = min(at, len(lines) - 1)
            cut = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:cut] + rng.choice(TEXT_GARBAGE) + lines[i][cut:]
        elif action < 0.8:
            depth = rng.choice([40, 500, 5000])
            lines.insert(at, b"name: " + b"[" * depth + b"]" * depth)
        elif action < 0.85:
            levels, width = rng.choice([(9, 9), (12, 10), (4, 100)])
            bomb = ['l0: &l0 ["lol"' + ', "lol"' * (width - 1) + "]"]
            for i in range(1, levels):
                bomb.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
            lines[0:0] = [b.encode() for b in bomb]
        elif action < 0.9:
            merge = ["m0: &m0 {k0: 1}"]
            for i in range(1, 30):
                merge.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}")
            lines[0:0] = [m.encode() for m in merge]
        elif action < 0.95:
            return b"\n".join(lines)[: rng.randrange(len(raw) + 1)]
        else:
            i = rng.randrange(len(lines)) if lines else 0
            if lines:
                lines[i] = b"  " * rng.randint(0, 3) + lines[i].lstrip()
    return b"\n".join(lines)


def generate(rng: random.Random, seeds: list[dict], keys: dict[str, list[str]]) -> bytes:
    data = _mutate_data(rng, rng.choice(seeds), keys) if rng.random() < 0.8 else rng.choice(seeds)
    raw = _dump(data)
    if rng.random() < 0.5:
        raw = _mutate_text(rng, raw)
    return raw


COMMANDS = [
    ("validate",),
    ("plan", "--json"),
    ("render", "--task", "worker:0", "--format", "env"),
    ("render", "--task", "ps:0"),
    ("up", "--dry-run", "--run-dir", "runs"),
]


class _Slow(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Slow()


def run_file(path: Path, seconds: float) -> list[dict]:
    """Every command on one file, in this (child) process."""
    from click.testing import CliRunner

    from tflaunch.cli import cli

    results = []
    signal.signal(signal.SIGPROF, _on_alarm)
    for command in COMMANDS:
        started = time.process_time()
        # A hard stop after 3x the CPU time; "slow" is judged from the CPU time taken. A command
        # that waits without using CPU is stopped by the parent's deadline.
        signal.setitimer(signal.ITIMER_PROF, seconds * 3)
        try:
            result = CliRunner().invoke(cli, [*command[:1], str(path), *command[1:]])
        except _Slow:
            results.append({"command": command[0], "code": "killed", "seconds": seconds * 3})
            continue
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        took = time.process_time() - started
        entry = {"command": " ".join(command[:2]), "code": result.exit_code, "seconds": took}
        exc = result.exception
        if exc is not None and not isinstance(exc, SystemExit):
            frames = traceback.extract_tb(result.exc_info[2])
            last = frames[-1] if frames else None
            where = f"{Path(last.filename).name}:{last.lineno}" if last else "?"
            entry["traceback"] = f"{type(exc).__name__} at {where}"
            entry["message"] = " ".join(str(exc).split())[:160]
            entry["memory"] = isinstance(exc, MemoryError)
        results.append(entry)
    return results


def run_in_child(path: Path, seconds: float, memory_mib: int) -> tuple[list[dict], int]:
    """Fork, limit the child's address space, run the commands; results and peak RSS (KiB)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        status = 0
        try:
            vsz = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limit = vsz + memory_mib * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child exits
            payload = json.dumps(run_file(path, seconds)).encode()
        except BaseException as err:  # noqa: BLE001 - everything is a finding here
            payload = json.dumps([{"command": "child", "code": "crash", "seconds": 0,
                                   "traceback": repr(err)[:200]}]).encode()  # fmt: skip
            status = 1
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        os._exit(status)
    os.close(write_end)
    payload = _read_until(read_end, time.monotonic() + seconds * 3 * len(COMMANDS) + 30)
    if payload is None:  # the child's own alarms did not end it: stop it from here
        os.kill(pid, signal.SIGKILL)
        payload = json.dumps([{"command": "child", "code": "killed", "seconds": seconds * 3}])
        payload = payload.encode()
    _, _, usage = os.wait4(pid, 0)
    try:
        results = json.loads(payload)
    except ValueError:
        results = [{"command": "child", "code": "died", "seconds": 0, "traceback": "no result"}]
    return results, usage.ru_maxrss


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes, or None if it has not finished by ``deadline``."""
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                return None
            chunk = f.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def warm_up(seeds: list[dict], workdir: Path, seconds: float) -> None:
    """Every command once on every seed file, here: what the commands import on first use
    (the clouds' SDKs among it) is then imported once, before the forks, not once per child."""
    path = workdir / "seed.yaml"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for data in seeds:
            path.write_bytes(_dump(data))
            run_file(path, seconds)
    path.unlink()


def fuzz(seed: int, count: int, seconds: float, memory_mib: int, keep: Path | None) -> dict:
    import tflaunch.launchers.local
    import tflaunch.launchers.slurm.backend
    import tflaunch.launchers.ssh.backend  # noqa: F401 - imported once, before the forks

    rng = random.Random(seed)
    seeds, keys = _seeds(), _schema_keys()
    codes: collections.Counter = collections.Counter()
    tracebacks: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    slow, big = [], []
    workdir = Path(tempfile.mkdtemp(prefix="tflaunch-fuzz-"))
    old_cwd = os.getcwd()
    os.chdir(workdir)  # run_dir and up --dry-run paths land here
    try:
        warm_up(seeds, workdir, seconds)
        for n in range(count):
            raw = generate(rng, seeds, keys)
            path = workdir / f"cluster-{n}.yaml"
            path.write_bytes(raw)
            results, peak_kib = run_in_child(path, seconds, memory_mib)
            for entry in results:
                codes[(entry["command"], entry["code"])] += 1
                if "traceback" in entry:
                    tracebacks[entry["traceback"]] += 1
                    examples.setdefault(entry["traceback"], f"{path}: {entry.get('message')}")
                if entry.get("memory"):
                    big.append((n, entry["command"], "MemoryError"))
                if entry["seconds"] > seconds or entry["code"] == "killed":
                    slow.append((n, entry["command"], round(entry["seconds"], 1)))
            if peak_kib > memory_mib * 1024:
                big.append((n, "all", f"{peak_kib // 1024} MiB peak"))
            keep_it = keep and any("traceback" in e for e in results)
            if keep_it:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / path.name).write_bytes(raw)
            path.unlink()
    finally:
        os.chdir(old_cwd)
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "files": count,
        "invocations": sum(codes.values()),
        "codes": codes,
        "tracebacks": tracebacks,
        "examples": examples,
        "slow": slow,
        "big": big,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=3000, help="cluster files to generate")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="slow past this much CPU time, per command"
    )
    parser.add_argument("--memory-mib", type=int, default=1024, help="memory limit per file")
    parser.add_argument("--keep", type=Path, default=None, help="keep files that crashed here")
    args = parser.parse_args(argv)
    started = time.monotonic()
    report = fuzz(args.seed, args.count, args.seconds, args.memory_mib, args.keep)
    print(
        f"{report['files']} files, {report['invocations']} invocations in "
        f"{time.monotonic() - started:.0f} s (seed {args.seed})"
    )
    print("exit codes by command:")
    for (command, code), n in sorted(report["codes"].items(), key=str):
        print(f"  {command:<16} {code!s:>6}: {n}")
    print(f"tracebacks: {sum(report['tracebacks'].values())}")
    for signature, n in report["tracebacks"].most_common():
        print(f"  {n:5}  {signature}  (e.g. {report['examples'][signature]})")
    print(f"over {args.seconds:g} s: {len(report['slow'])}  {report['slow'][:10]}")  # of CPU
    print(f"over {args.memory_mib} MiB: {len(report['big'])}  {report['big'][:10]}")
    failed = report["tracebacks"] or report["slow"] or report["big"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
