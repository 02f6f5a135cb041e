"""scripts/check_test_clock.py: a planted wall-clock bound or literal port fails the check;
waits with a deadline, CPU bounds and free ports pass; the allow-list names each exception."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location(
    "check_test_clock", ROOT / "scripts" / "check_test_clock.py"
)
check_test_clock = importlib.util.module_from_spec(_spec)
sys.modules["check_test_clock"] = check_test_clock  # its dataclass looks its module up
_spec.loader.exec_module(check_test_clock)

PLANTED_CLOCK = """
import time

def test_parse_is_fast():
    started = time.monotonic()
    parse()
    assert time.monotonic() - started < 2
"""

PLANTED_ELAPSED = """
from time import perf_counter

def test_up_is_quick():
    t0 = perf_counter()
    up()
    elapsed = perf_counter() - t0
    assert elapsed < 10, elapsed
"""

PLANTED_IF_FAIL = """
import time
import pytest

def test_report():
    begun = time.time()
    report()
    if time.time() - begun > 3:
        pytest.fail("too slow")
"""

PLANTED_TIMER = """
import time

def timed(*args):
    started = time.monotonic()
    result = run(*args)
    return time.monotonic() - started, result

def test_second_run_is_faster():
    first_time, first = timed("a")
    _, other = timed("c")
    assert other.returncode == 0 and len(other.stdout) > 0  # what came back, not how fast
    second_time, second = timed("b")
    assert second_time < first_time
"""

PORT = 2222  # in the planted string below through a variable: a literal would fail this file
PLANTED_PORTS = {
    "a string": f'ADDRESS = "127.0.0.1:{PORT}"\n',
    "a tuple": 'import socket\nsocket.create_connection(("localhost", 2230))\n',
    "a keyword": "server = Server(host='0.0.0.0', port=8080)\n",
}

FINE = """
import time
from tests.helpers import cpu_bounded, free_port_base

def test_bounded():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ready():
        time.sleep(0.2)
    assert time.monotonic() < deadline, "never ready"  # a hang caught, no verdict on speed
    with cpu_bounded(2.0):
        parse()
    port = free_port_base()
    assert connect(f"127.0.0.1:{port}")
    assert plan("h:1", "127.0.0.1:1") and count < 5  # port 1: nothing can listen there
"""


@pytest.mark.parametrize("source", [PLANTED_CLOCK, PLANTED_ELAPSED, PLANTED_IF_FAIL, PLANTED_TIMER])
def test_a_planted_wall_clock_bound_is_found(source):
    (finding,) = check_test_clock.check_source(source, "tests/test_x.py")
    assert finding.kind == "clock" and finding.function.startswith("test_")
    assert str(finding).startswith(f"tests/test_x.py:{finding.line} in {finding.function}: clock")


@pytest.mark.parametrize("source", PLANTED_PORTS.values(), ids=PLANTED_PORTS)
def test_a_planted_literal_port_is_found(source):
    (finding,) = check_test_clock.check_source(source, "tests/test_x.py")
    assert finding.kind == "port"


def test_deadlines_cpu_bounds_and_free_ports_pass():
    assert check_test_clock.check_source(FINE, "tests/test_x.py") == []


def test_the_command_fails_on_a_planted_bound_and_the_allow_list_names_it(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(PLANTED_CLOCK + PLANTED_PORTS["a string"])
    script = ROOT / "scripts" / "check_test_clock.py"
    done = subprocess.run(
        [sys.executable, str(script), str(planted)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert f"{planted.as_posix()}:7 in test_parse_is_fast: clock:" in done.stdout
    assert ": port: " in done.stdout and "ALLOWED" in done.stderr

    name = planted.as_posix()
    allowed = {
        (name, "test_parse_is_fast", "clock"): "the behaviour is timed",
        (name, "", "port"): "nothing binds it",
        (name, "test_gone", "clock"): "a test that was removed",
    }
    assert check_test_clock.check([planted], allowed) == [
        f"{name}: allow-list entry 'test_gone' (clock) matches nothing"
    ]


def test_the_tests_pass_the_check():
    assert check_test_clock.check([ROOT / "tests"]) == []


def test_the_check_runs_before_pytest_in_the_test_script():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert script.index("check_test_clock.py") < script.index("-m pytest")


def test_the_allow_list_gives_every_exception_a_reason():
    for key, why in check_test_clock.ALLOWED.items():
        assert len(why.split()) >= 4, key
        assert Path(ROOT / key[0]).is_file(), key
