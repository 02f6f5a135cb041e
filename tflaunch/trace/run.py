"""One traced run as its launcher hands it to the coordinator (``coordinate(..., trace=...)``).

:class:`RunTrace` is the request ``up --trace`` made (:class:`~tflaunch.trace.request.TraceRequest`)
and, where the backend says so, the site its capture runs on (``Backend.trace_site``; else this
machine, in the request's trace directory). The coordinator begins it once it knows the leader,
its way to speak and its way to the agents, and gets the window's
:class:`~tflaunch.trace.window.TraceTrigger`, which it drives to the verdict. This is the only
place the runtime's seam (:class:`tflaunch.runtime.tracing.Trace`) meets the tracing package.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tflaunch.cluster.plan import Plan
from tflaunch.runtime.tracing import Say, Send
from tflaunch.trace.request import TraceRequest
from tflaunch.trace.site import TraceSite
from tflaunch.trace.window import TraceTrigger


@dataclass(frozen=True)
class RunTrace:
    """``up --trace`` of one run: what was asked, and where the capture runs (None: here)."""

    request: TraceRequest
    site: TraceSite | None = None

    def begin(self, plan: Plan, leader: str, say: Say, send: Send) -> TraceTrigger:
        """The window's trigger over ``plan``'s tasks, its capture helper started ahead (the
        clock's window is ticked by the coordinator)."""
        addresses = {
            f"{job}:{i}": address
            for job, items in plan.cluster.items()
            for i, address in enumerate(items)
        }
        trigger = TraceTrigger(
            self.request, leader, addresses, plan.program.argv, say, time.monotonic(), self.site
        )
        trigger.site.connect(send)
        trigger.start_helper()
        return trigger
