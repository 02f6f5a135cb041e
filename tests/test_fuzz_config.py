"""A small sample of the cluster-file fuzz (tests/fuzz_config.py): no traceback, nothing slow or
oversized. The full run is ``python tests/fuzz_config.py --seed 1 --count 3000``.

The fuzz forks a child per file, so it runs in a fresh interpreter: forking the test process,
where earlier tests left threads, could copy a lock one of them held and hang the child."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow  # 750 launcher runs: 11 s on this 2-core machine, alone
def test_150_mutated_files_give_no_traceback_and_stay_small_and_fast():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fuzz_config.py"), "--seed", "7", "--count", "150"],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "150 files, 750 invocations" in result.stdout
    assert "tracebacks: 0\n" in result.stdout
    assert "over 10 s: 0 " in result.stdout and "over 1024 MiB: 0 " in result.stdout
    codes = [line.split()[-2:] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert {code for code, _ in codes} <= {"0:", "2:"}, result.stdout  # no 1, killed, crash
    assert sum(int(n) for code, n in codes if code == "2:") > 100, result.stdout  # it bites
