"""``supervision.max_runtime`` on the launcher's side: at the limit the run is stopped as by
Ctrl-C (teardown everywhere, the run ends as stopped). Provisioned instances enforce the same
limit by themselves (see :mod:`tflaunch.launchers.clouds.watchdog`)."""

from __future__ import annotations

import _thread
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def runtime_limit(seconds: float | None, say: Callable[[str], None]) -> Iterator[None]:
    """Interrupt the main thread (as SIGINT) if the block lasts longer than ``seconds``."""
    if not seconds:
        yield
        return

    def expire() -> None:
        say(f"the run reached supervision.max_runtime ({seconds:g} s); stopping it")
        _thread.interrupt_main()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
