"""One test-host set per machine at a time: a file lock that other users wait on.

Two pytest sessions (or a benchmark beside a test run) would otherwise tear down each other's
namespaces and daemons mid-run.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(lock_file: Path, what: str, timeout: float) -> Iterator[None]:
    """Hold ``lock_file`` for the block; wait up to ``timeout`` seconds for another holder."""
    with lock_file.open("a") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} stayed busy ({lock_file})") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
