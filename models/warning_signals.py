"""SIGUSR1/SIGUSR2 in the programs: Slurm's ``--signal`` ahead of the time limit, which tflaunch
also passes on to every task. A program must never die of one, at any moment of its life.

- From its first line (before TensorFlow loads) until it handles them: :func:`ignore_warnings`.
- While the chief can act on them (checkpoint now): :func:`warnings_caught` records them, and sets
  them back to ignored when the block ends, however it ends.

Why not keep the handler until the exit: as the interpreter finalizes, CPython sets every signal
whose handler is a Python function back to its default action, which for SIGUSR1 is to end the
process (exit 138); TensorFlow's own teardown can take seconds after that. A signal that is
ignored stays ignored, so a warning that comes while the chief exits does nothing.

No TensorFlow here: the programs import this before it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)


def ignore_warnings() -> None:
    """SIGUSR1 and SIGUSR2 ignored, also through the interpreter's exit."""
    for sig in WARNINGS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def warnings_caught() -> Iterator[list[int]]:
    """Within the block, SIGUSR1/SIGUSR2 are appended to the list it gives; after it, ignored."""
    caught: list[int] = []
    try:
        for sig in WARNINGS:
            signal.signal(sig, lambda signum, _frame: caught.append(signum))
        yield caught
    finally:
        ignore_warnings()
