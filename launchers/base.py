"""The interface every backend fills in, and the pieces backends share.

A backend knows only how to find its hosts and how to start one agent per host and carry the
agent's JSON-lines stream; planning, supervision policy and run state are the same everywhere.
Backends whose coordinator runs in the launcher (local, ssh) use ``Backend.launch`` as is; Slurm
overrides it to submit a job whose first node coordinates.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import TflaunchError
from tflaunch.runtime.coordinator import Requeue, Revive, coordinate
from tflaunch.runtime.run import Outcome, Run


class Backend(ABC):
    """How one kind of infrastructure starts agents."""

    name: str = ""
    requeue: Requeue | None = None  # what Slurm's warning signal leads to (the Slurm job only)

    @abstractmethod
    def hosts(self, config: ClusterConfig) -> list[Host]:
        """The concrete hosts the plan is made for."""

    @abstractmethod
    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        """Start one agent per host that has tasks; return their links."""

    def launch(self, config: ClusterConfig, plan: Plan, run: Run, on_ready: Any = None) -> Outcome:
        """Start the agents and coordinate the cluster until it ends."""
        run.start(self.name, [h.name for h in plan.hosts_with_tasks()])
        try:
            links = self.start_agents(config, plan, run)
        except TflaunchError as err:
            run.finish(Outcome(err.exit_code, str(err)))
            raise
        revive = self.reviver(config, plan, run)
        return coordinate(plan, run, links, on_ready, requeue=self.requeue, revive=revive)

    def reviver(self, config: ClusterConfig, plan: Plan, run: Run) -> Revive | None:
        """How to start a new agent on a host that stopped answering and answers again
        (``ssh.host_wait``); None: this backend cannot, and a lost host fails the run."""
        return None

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, cluster_file: str, run_root: str
    ) -> str:
        """Start the run in the background; return what ``up --detach`` prints (the run id).

        Default: a detached local coordinator, returning once the cluster is ready. Slurm
        returns once the job is submitted."""
        from tflaunch.runtime import runctl

        runctl.spawn_detached(cluster_file, run, run_root, config.supervision.ready_timeout + 60)
        return run.id

    def dry_run(self, config: ClusterConfig, plan: Plan, run: Run) -> str:
        """What ``up --dry-run`` prints, starting nothing: the plan, or what would be submitted."""
        return json.dumps(plan.to_dict(), indent=2)

    def refresh(self, run: Run) -> None:
        """Bring a run that lives elsewhere (a detached SSH run) up to date in the local run
        directory; a run whose files are already here needs nothing."""
        return None

    def describe(self, run: Run) -> list[str]:
        """Extra lines for ``tflaunch status`` (e.g. the Slurm job's state); none by default."""
        return []

    def down(self, run: Run, grace: float) -> str:
        """Stop a detached run; returns what was done. Default: signal its local coordinator."""
        from tflaunch.runtime import runctl

        return runctl.stop_local_coordinator(run, grace)

    def exec_command(self, run: Run, argv: list[str], show: Any) -> int:
        """``tflaunch exec``: run a command on every host of a run; its exit code."""
        from tflaunch.errors import TflaunchError

        raise TflaunchError(
            f"exec runs commands on the hosts of ssh runs; run {run.id} has backend {self.name}."
        )

    def cluster_alive(self, run: Run) -> bool:
        """Whether the run's coordinator (and so its cluster) is still running."""
        from tflaunch.runtime import runctl

        return runctl.coordinator_alive(run)
