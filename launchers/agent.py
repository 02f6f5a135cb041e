"""One host's agent as the backends start it: ``python -m tflaunch.launchers.agent --plan
plan.json --host NAME --run-dir DIR`` (the command :func:`tflaunch.runtime.link.agent_argv`
writes), or :func:`serve` inside a backend's own node process (a batch job's node, a detached
SSH run's host).

The runtime's agent (:mod:`tflaunch.runtime.agent`) knows nothing of tracing: here, at the one
door every agent comes through, it is handed its host's side of ``up --trace``
(:class:`tflaunch.trace.links.HostTrace`) when the plan's tasks carry the request.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO

from tflaunch.cluster.plan import Plan
from tflaunch.runtime import agent
from tflaunch.trace.links import HostTrace, traced


def serve(
    plan: Plan,
    host: str,
    run_dir: str | os.PathLike,
    commands: IO[str],
    events: IO[str],
    await_start: bool = False,
    generation: int = 0,
) -> int:
    """:func:`tflaunch.runtime.agent.serve`, traced when the plan is."""
    trace = HostTrace if traced(plan.program.env) else None
    return agent.serve(plan, host, run_dir, commands, events, await_start, generation, trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tflaunch.launchers.agent", description=__doc__)
    parser.add_argument("--plan", required=True, help="plan.json written by the launcher")
    parser.add_argument("--host", required=True, help="the host of the plan this agent runs")
    parser.add_argument("--run-dir", required=True, help="where task logs go")
    parser.add_argument(
        "--await-start",
        action="store_true",
        help="a lost host's new agent: start the tasks when the coordinator says start",
    )
    args = parser.parse_args(argv)
    plan = Plan.from_dict(json.loads(Path(args.plan).read_text()))
    # Events own the real stdout; anything else printed here must not corrupt the stream.
    events_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    return serve(plan, args.host, args.run_dir, sys.stdin, events_out, args.await_start)


if __name__ == "__main__":
    sys.exit(main())
