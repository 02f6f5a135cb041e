"""Where the suite's time goes: a pytest plugin that records each test's wall and CPU seconds.

    python -m pytest -p tests.costs --costs DIR ...    then    python scripts/test_costs.py DIR

For every test (its setup, call and teardown together, so a module-scoped fixture's set-up counts
against the module's first test) it writes one JSON line to ``DIR/<worker>.jsonl``: the test's id,
its module, its outcome, when it began (epoch seconds), wall seconds, and CPU seconds of this process (``self``) and of the
children it waited for during the test (``children``: the launcher processes a test runs, and the
tasks they waited for, which is where TensorFlow's imports are counted). Under pytest-xdist each
worker writes its own file, and a ``session`` line at its end with the worker's totals, so the
script can merge them and say how much of the run no test accounts for.

What no waited-for child reports is not counted: daemons that were never waited for (an sshd or
slurmd in a test host, a detached launcher's tasks reaped by init).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--costs",
        metavar="DIR",
        default=os.environ.get("TEST_COSTS_DIR") or None,
        help="write each test's wall and CPU seconds to DIR/<worker>.jsonl (scripts/test_costs.py "
        "prints them); default $TEST_COSTS_DIR, else not recorded",
    )


class Recorder:
    def __init__(self, folder: Path, worker: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{worker}.jsonl"
        self.worker = worker
        self.started = time.perf_counter(), *_cpu()
        self.outcomes: dict[str, str] = {}

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        began = time.time()
        wall, own, children = time.perf_counter(), *_cpu()
        yield
        wall_after, own_after, children_after = time.perf_counter(), *_cpu()
        self.write(
            {
                "test": item.nodeid,
                "module": item.nodeid.split("::", 1)[0],
                "worker": self.worker,
                "outcome": self.outcomes.pop(item.nodeid, "unknown"),
                "start": round(began, 3),
                "wall": round(wall_after - wall, 3),
                "self": round(own_after - own, 3),
                "children": round(children_after - children, 3),
            }
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            previous = self.outcomes.get(report.nodeid)
            if previous in (None, "passed"):
                self.outcomes[report.nodeid] = report.outcome

    def pytest_sessionfinish(self) -> None:
        wall, own, children = self.started
        now, own_now, children_now = time.perf_counter(), *_cpu()
        self.write(
            {
                "session": self.worker,
                "wall": round(now - wall, 3),
                "self": round(own_now - own, 3),
                "children": round(children_now - children, 3),
            }
        )


def pytest_configure(config: pytest.Config) -> None:
    folder = config.getoption("costs")
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main" and getattr(config.option, "numprocesses", None):
        return  # the xdist controller runs no tests; its workers record
    config.pluginmanager.register(Recorder(Path(folder), worker), "tests-costs-recorder")
