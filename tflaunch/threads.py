"""One call per item in daemon threads, waited for up to an overall deadline.

What asks other machines (SSH hosts, a resolver, a scheduler) runs here, so that one slow or
silent peer costs the deadline once, not its own timeout per item in turn. The threads are
daemons: one still waiting when its caller gives up does not hold the process at its exit, as
a ``ThreadPoolExecutor``'s threads would (they are joined at exit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    """What one call made of its item: its value, what it raised, or nothing in time."""

    item: T
    value: Any = None
    error: BaseException | None = None
    done: bool = True  # False: no answer before the deadline (the call may still be running)


def in_threads(
    func: Callable[[T], Any],
    items: Iterable[T],
    workers: int,
    deadline_s: float | None = None,
    name: str = "tflaunch",
) -> list[Answer[T]]:
    """``func`` of every item, in up to ``workers`` daemon threads; the answers in the items'
    order. With ``deadline_s``, what has not answered that many seconds after the first call
    is ``done=False`` and nothing waits for it; without, every call is waited for. Whatever a
    call raises (BaseException too) is its answer's ``error``."""
    items = list(items)
    answers: dict[int, Answer[T]] = {}
    pending = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                answers[i] = Answer(items[i], value=func(items[i]))
            except BaseException as err:  # the caller decides what an error means
                answers[i] = Answer(items[i], error=err)

    threads = [
        threading.Thread(target=work, name=name, daemon=True)
        for _ in range(min(workers, len(items)))
    ]
    for thread in threads:
        thread.start()
    end = None if deadline_s is None else time.monotonic() + deadline_s
    for thread in threads:
        thread.join(None if end is None else max(0.0, end - time.monotonic()))
    return [answers.get(i, Answer(item, done=False)) for i, item in enumerate(items)]
