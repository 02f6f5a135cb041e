"""SIGUSR1/SIGUSR2 (Slurm's warning, passed on by tflaunch) in the programs: caught while the
chief can act on them, harmless afterwards, through the interpreter's exit.

The signal is raised by a C exit handler (``__cxa_atexit``), which runs after Python's
finalization: the window in which a chief that kept its Python handler died with exit 138."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from tests.helpers import ROOT

PROGRAM = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    from tflaunch.models.warning_signals import warnings_caught

    libc = ctypes.CDLL(None)
    late = int(sys.argv[2])  # raised once the interpreter has finalized
    libc.__cxa_atexit(ctypes.cast(libc["raise"], ctypes.c_void_p), ctypes.c_void_p(late), None)
    if sys.argv[1] == "handler":  # what the PSS chief did: its handler left in place
        signal.signal(late, lambda *_: None)
    else:
        with warnings_caught() as caught:
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGUSR2)
            deadline = time.monotonic() + 10
            while len(caught) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            print("caught", sorted(signal.Signals(s).name for s in caught), flush=True)
            if sys.argv[1] == "raise":
                raise SystemExit(3)
    print("exiting", flush=True)
    """
)


def run(mode: str, sig: signal.Signals) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, str(int(sig))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_python_handler_left_in_place_dies_of_a_signal_during_the_exit():
    """Why the chief sets them back to ignored: CPython resets a Python-handled signal to its
    default action as it finalizes (the check that this test sees the window at all)."""
    result = run("handler", signal.SIGUSR1)
    assert "exiting" in result.stdout
    assert result.returncode == -signal.SIGUSR1  # a shell says 138


def test_warnings_are_caught_in_the_block_and_harmless_through_the_exit():
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        result = run("block", sig)
        assert result.stdout.splitlines() == ["caught ['SIGUSR1', 'SIGUSR2']", "exiting"]
        assert result.returncode == 0, result.stderr


def test_warnings_are_harmless_after_a_block_that_raised():
    result = run("raise", signal.SIGUSR1)
    assert result.stdout.splitlines() == ["caught ['SIGUSR1', 'SIGUSR2']"]
    assert result.returncode == 3, result.stderr
