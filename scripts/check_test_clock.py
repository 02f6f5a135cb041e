#!/usr/bin/env python3
"""No verdict from the clock: fail on a wall-clock bound or a literal port in the tests.

    python scripts/check_test_clock.py [FILE_OR_FOLDER ...]      (default: tests/)

A test may bound work (CPU time: tests.helpers.cpu_bounded; bytes; calls), never wall time, unless
it times the behaviour itself (a kill that ends the cluster within N s, a sampler's interval): on
the shared 2-core machine a 5 ms parse once took 35 s of wall time. Every port it binds or
connects to comes from a free-port helper (tests.helpers.free_port_base): a fixed one was once
held by the other worker's run. scripts/test.sh runs this before pytest.

It reports, by file, line and function:
- clock: an ``assert`` (or an ``if`` that fails the test) comparing a duration: a difference of
  ``time.time()``/``monotonic()``/``perf_counter()`` readings, a name assigned one (also from a
  function of the same file that returns one, alone or in a tuple: ``took, result = timed()``),
  or a name called ``elapsed``/``duration``/``took``;
- port: a port of 1024 or more written as a literal on a loopback or any-address
  (``"127.0.0.1:2222"``, ``("localhost", 2222)``) or as ``port=2222``.

ALLOWED names each exception (file, function, kind) and why; an entry that no longer matches
anything is reported too, so the list cannot rot.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (path relative to the repository, function, kind) -> why the clock or the port is the subject.
ALLOWED: dict[tuple[str, str, str], str] = {
    # The promise "a failed task ends the cluster within seconds, not at the walltime", timed.
    ("tests/helpers.py", "assert_kill_ends_cluster", "clock"):
        "a killed local task ends the whole cluster within N s",
    ("tests/test_slurm_e2e.py", "test_worker_killed_on_node2_ends_the_job_within_10s", "clock"):
        "a killed task ends the Slurm job within 10 s",
    ("tests/ssh/test_ssh_backend.py", "test_worker_killed_on_host2_ends_cluster_with_report",
     "clock"): "a killed task ends the cluster on every SSH host within 10 s",
    ("tests/ssh/test_ssh_backend.py", "test_cut_link_leaves_no_task_on_any_host", "clock"):
        "a cut SSH link ends the remote tasks within the agent's heartbeat timeout",
    ("tests/ssh/test_ssh_backend.py", "test_cut_link_with_chatty_tasks_leaves_no_task", "clock"):
        "the same with tasks that fill the link: the heartbeat timeout still holds",
    ("tests/ssh/test_ssh_backend.py",
     "test_lost_host_still_silent_after_host_wait_fails_the_run_naming_it", "clock"):
        "a lost host fails the run after the configured host wait, not later",
    # Timers that are the behaviour under test.
    ("tests/cloud/test_ssh_watchdog.py", "test_idle_timeout_counts_from_the_last_activity",
     "clock"): "the idle limit must not end a run before the limit has passed (a lower bound)",
    ("tests/test_coordinator_hosts.py", "revive", "clock"):
        "the backend is asked for the lost host at once, with the whole host wait left",
    ("tests/test_coordinator_hosts.py",
     "test_the_warning_signal_stops_the_run_for_a_requeue_after_the_wait", "clock"):
        "the requeue waits checkpoint_wait (1 s) after Slurm's warning: not sooner, not forever",
    ("tests/test_monitor.py",
     "test_tree_cpu_includes_a_busy_child_and_memory_and_threads_add_up", "clock"):
        "cpu_percent is CPU per wall second by definition; the expected value uses the same clock",
    ("tests/test_monitor.py",
     "test_sampler_thread_samples_at_once_at_its_interval_and_once_more_when_stopped", "clock"):
        "the sampler's interval and its prompt stop are the behaviour",
    ("tests/test_readiness.py",
     "test_foreign_listener_on_the_ps_port_between_check_and_bind_fails_naming_the_port",
     "clock"): "the foreign listener is found by the readiness check, well before ready_timeout",
    ("tests/test_rendezvous.py", "test_slow_sender_cannot_hold_the_rendezvous", "clock"):
        "the hello deadline is total, not per byte: a slow sender cannot stretch it",
    ("tests/test_restart_local.py",
     "test_silent_worker_is_reported_stalled_within_timeout_plus_5s", "clock"):
        "the stall timeout (3 s) is the behaviour",
    ("tests/test_benchmark.py", "test_timed_loop_times_only_the_steps_after_the_barrier",
     "clock"): "the benchmark's own timing, checked for consistency (total >= sum of its steps)",
    # Deadlines that run at once, not one after another: waiting takes no CPU to bound.
    ("tests/test_broken_runs.py",
     "test_twenty_detached_runs_on_hosts_that_never_speak_cost_the_list_one_deadline", "clock"):
        "20 silent hosts cost status one probe deadline, not twenty (probed in parallel)",
    ("tests/test_slow_resolver.py",
     "test_a_hundred_names_cost_one_deadline_and_the_slow_ones_are_named", "clock"):
        "a hundred slow host names cost one look-up deadline, not a hundred (looked up at once)",
    ("tests/test_slow_resolver.py",
     "test_validate_of_a_hundred_slow_host_names_is_out_within_ten_seconds", "clock"):
        "validate's look-ups of a hundred slow names share one deadline",
    # Literal addresses that nothing binds or connects to.
    ("tests/cloud/test_ssh_provision.py",
     "test_a_provisioned_up_plans_twice_and_writes_the_plan_once", "port"):
        "the PS address expected in plan.json of an up that cannot connect; nothing listens",
}  # fmt: skip

CLOCKS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}
DURATION_NAME = re.compile(r"(^|_)(elapsed|duration|took)(_|$)")
LOOPBACK = re.compile(r"(?:localhost|127\.\d+\.\d+\.\d+|0\.0\.0\.0|\[::1?\]):(\d{1,5})\b")
HOSTS = re.compile(r"^(?:localhost|127\.\d+\.\d+\.\d+|0\.0\.0\.0|::1?|)$")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    function: str
    kind: str  # clock | port
    text: str

    def __str__(self) -> str:
        where = f" in {self.function}" if self.function else ""
        return f"{self.path}:{self.line}{where}: {self.kind}: {self.text}"


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _mentions_clock(node: ast.AST, clock_names: set[str]) -> bool:
    return any(_is_clock_call(n) for n in ast.walk(node)) or bool(_names(node) & clock_names)


def _identifier(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


class _Scope(ast.NodeVisitor):
    """One function's (or the module's) statements: which names hold clock readings and
    durations, and which verdicts compare a duration."""

    def __init__(
        self,
        path: str,
        function: str,
        findings: list[Finding],
        source: str,
        timers: dict[str, set[int | None]] | None = None,
    ) -> None:
        self.path, self.function, self.findings, self.source = path, function, findings, source
        self.clock_names: set[str] = set()  # a reading: started, deadline
        self.duration_names: set[str] = set()  # a difference of readings: elapsed
        # the file's functions that return a duration -> where: None (the value) or tuple indexes
        self.timers = timers if timers is not None else {}

    def run(self, body: list[ast.stmt]) -> None:
        for statement in body:
            self.visit(statement)

    # nested functions are scopes of their own
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        scope = _Scope(self.path, node.name, self.findings, self.source, self.timers)
        scope.clock_names |= self.clock_names
        scope.run(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _assigned(self, targets: list[ast.expr], value: ast.expr | None) -> None:
        if value is None:
            return
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        timed = self.timers.get(_identifier(value.func)) if isinstance(value, ast.Call) else None
        if timed:
            for target in targets:
                if isinstance(target, ast.Name) and None in timed:
                    self.duration_names.add(target.id)
                elif isinstance(target, ast.Tuple):
                    self.duration_names.update(
                        e.id
                        for i, e in enumerate(target.elts)
                        if i in timed and isinstance(e, ast.Name)
                    )
            return
        if self._is_duration(value):
            self.duration_names.update(names)
        elif _mentions_clock(value, self.clock_names):
            self.clock_names.update(names)

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned([node.target], node.value)
        self.generic_visit(node)

    def _is_duration(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub):
                sides = (sub.left, sub.right)
                if any(_mentions_clock(side, self.clock_names) for side in sides):
                    return True
            if isinstance(sub, ast.Name) and sub.id in self.duration_names:
                return True
            if DURATION_NAME.search(_identifier(sub)) and isinstance(
                sub, (ast.Name, ast.Attribute)
            ):
                return True
        return False

    def _compares_duration(self, test: ast.AST) -> bool:
        for sub in ast.walk(test):
            if not isinstance(sub, ast.Compare):
                continue
            ordered = any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in sub.ops)
            if ordered and any(self._is_duration(s) for s in [sub.left, *sub.comparators]):
                return True
        return False

    def _report(self, node: ast.AST, kind: str) -> None:
        text = (ast.get_source_segment(self.source, node) or "").strip().splitlines()
        self.findings.append(
            Finding(self.path, node.lineno, self.function, kind, text[0] if text else "")
        )

    def visit_Assert(self, node: ast.Assert) -> None:
        if self._compares_duration(node.test):
            self._report(node, "clock")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        fails = any(
            isinstance(n, ast.Raise) or (isinstance(n, ast.Call) and _identifier(n.func) == "fail")
            for statement in node.body
            for n in ast.walk(statement)
        )
        if fails and self._compares_duration(node.test):
            self._report(node, "clock")
        self.generic_visit(node)

    # -- ports
    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            for match in LOOPBACK.finditer(node.value):
                if int(match.group(1)) >= 1024:
                    self._report(node, "port")
                    break

    def visit_Tuple(self, node: ast.Tuple) -> None:
        if (
            len(node.elts) == 2
            and isinstance(node.elts[0], ast.Constant)
            and isinstance(node.elts[0].value, str)
            and HOSTS.match(node.elts[0].value)
            and _literal_port(node.elts[1])
        ):
            self._report(node, "port")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg == "port" and _literal_port(node.value):
            self._report(node.value, "port")
        self.generic_visit(node)


def _literal_port(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant) and type(node.value) is int and 1024 <= node.value <= 65535
    )


def _timers(tree: ast.Module, path: str, source: str) -> dict[str, set[int | None]]:
    """The file's functions that return a duration, and where in what they return: None for
    the value itself, an index for an element of a returned tuple."""
    timers: dict[str, set[int | None]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        scope = _Scope(path, node.name, [], source)
        for statement in node.body:  # learns the clock readings and durations it assigns
            scope.visit(statement)
        where: set[int | None] = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Return) and sub.value is not None:
                if isinstance(sub.value, ast.Tuple):
                    where.update(i for i, e in enumerate(sub.value.elts) if scope._is_duration(e))
                elif scope._is_duration(sub.value):
                    where.add(None)
        if where:
            timers[node.name] = where
    return timers


def check_source(source: str, path: str) -> list[Finding]:
    """The findings in one file's text (``path`` as it is reported and allow-listed)."""
    findings: list[Finding] = []
    tree = ast.parse(source, path)
    _Scope(path, "", findings, source, _timers(tree, path, source)).run(tree.body)
    return sorted(findings, key=lambda f: f.line)


def check(paths: list[Path], allowed: dict[tuple[str, str, str], str] = ALLOWED) -> list[str]:
    """Problems in ``paths`` (files, or folders searched for ``*.py``): findings that are not
    allowed, and allowed entries that match nothing among the files checked."""
    files = sorted(
        {f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")) if f.suffix == ".py"}
    )
    problems, used = [], set()
    for file in files:
        name = _relative(file)
        for finding in check_source(file.read_text(), name):
            key = (finding.path, finding.function, finding.kind)
            if key in allowed:
                used.add(key)
            else:
                problems.append(str(finding))
    checked = {_relative(f) for f in files}
    for key in allowed:
        if key not in used and key[0] in checked:
            problems.append(f"{key[0]}: allow-list entry {key[1]!r} ({key[2]}) matches nothing")
    return problems


def _relative(file: Path) -> str:
    try:
        return file.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return file.as_posix()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in args] or [ROOT / "tests"]
    problems = check(paths)
    if problems:
        print("\n".join(problems))
        print(
            f"\ncheck_test_clock: {len(problems)} problem(s). Bound work, not wall time "
            "(tests.helpers.cpu_bounded), take ports from tests.helpers.free_port_base, or, where "
            "the clock or the port is the subject, name the test in ALLOWED in "
            "scripts/check_test_clock.py with the reason.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
