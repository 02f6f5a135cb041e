"""The interface every backend fills in, and the pieces backends share.

A backend knows only how to find its hosts and how to start one agent per host and carry the
agent's JSON-lines stream; planning, supervision policy and run state are the same everywhere.
Backends whose coordinator runs in the launcher (local, ssh) use ``Backend.launch`` as is; Slurm
overrides it to submit a job whose first node coordinates.

Whatever else differs between backends is a method here, so that no other module needs to know
which backend it has: the options of ``up`` it honours (:class:`LaunchOptions`), the environment
it needs, the interpreter on its hosts, where its run files live, where TensorBoard runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflaunch.cluster.backends import BackendFeature
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.runtime import procs
from tflaunch.runtime.coordinator import Requeue, Revive, coordinate
from tflaunch.runtime.link import ProcessLink, agent_argv
from tflaunch.runtime.run import Outcome, Run
from tflaunch.trace.request import TraceRequest
from tflaunch.trace.run import RunTrace
from tflaunch.trace.site import TraceSite


@dataclass(frozen=True)
class LaunchOptions:
    """What ``tflaunch up`` asks of the backend beyond the cluster file, passed as a parameter."""

    terminals: str | None = None  # up --terminals KIND: one window per task (see check_options)
    down_at_end: bool = False  # up --down: end the machines the run created when it ends
    keep: bool = False  # up --keep: keep them as the file's named cluster, or reuse that one
    recreate: bool = False  # up --recreate: replace a kept cluster that does not fit the plan
    trace: TraceRequest | None = None  # up --trace (in the config's program env already)

    def features(self) -> list[tuple[BackendFeature, str]]:
        """The optional abilities these options ask of the backend, each with its option (``up``
        refuses those the backend does not declare: BackendSpec.features)."""
        asked = [
            (BackendFeature.TERMINALS, "--terminals" if self.terminals else ""),
            (BackendFeature.KEEP, "--keep" if self.keep else ""),
        ]
        return [(feature, option) for feature, option in asked if option]

    def argv(self) -> list[str]:
        """The same options as ``up`` arguments (for the background half of ``up --detach``)."""
        return (
            (["--terminals", self.terminals] if self.terminals else [])
            + (["--down"] if self.down_at_end else [])
            + (["--keep"] if self.keep else [])
            + (["--recreate"] if self.recreate else [])
            + (self.trace.argv() if self.trace else [])
        )


class Backend(ABC):
    """How one kind of infrastructure starts agents."""

    name: str = ""
    requeue: Requeue | None = None  # what Slurm's warning signal leads to (the Slurm job only)

    @abstractmethod
    def hosts(self, config: ClusterConfig) -> list[Host]:
        """The concrete hosts the plan is made for."""

    def hosts_pending(self, config: ClusterConfig) -> bool:
        """Whether :meth:`hosts` are placeholders for machines that :meth:`launch` makes (then
        the plan is made again on the real hosts, and only that one is written)."""
        return False

    @abstractmethod
    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        """Start one agent per host that has tasks; return their links."""

    def launch(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> Outcome:
        """Start the agents and coordinate the cluster until it ends."""
        run.start(self.name, [h.name for h in plan.hosts_with_tasks()])
        try:
            links = self.start_agents(config, plan, run)
        except TflaunchError as err:
            run.finish(Outcome(err.exit_code, str(err)))
            raise
        revive = self.reviver(config, plan, run)
        request = options.trace if options else None
        trace = RunTrace(request, self.trace_site(config, plan, run)) if request else None
        return coordinate(plan, run, links, requeue=self.requeue, revive=revive, trace=trace)

    def reviver(self, config: ClusterConfig, plan: Plan, run: Run) -> Revive | None:
        """How to start a new agent on a host that stopped answering and answers again
        (``ssh.host_wait``); None: this backend cannot, and a lost host fails the run."""
        return None

    def trace_site(self, config: ClusterConfig, plan: Plan, run: Run) -> TraceSite | None:
        """Where a traced run's capture of any program runs and its files are, once the
        agents started; None: on this machine, which reaches every task's profiler port and
        shares the run's trace directory with the tasks (local, Slurm). Asked of traced runs only."""
        return None

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> str:
        """Start the run in the background; return what ``up --detach`` prints (the run id).

        Default: a detached local coordinator (``up`` of the run's cluster file, in its runs
        directory) given the same options, returning once the cluster is ready. Slurm returns
        once the job is submitted."""
        from tflaunch.runtime import runctl

        timeout = config.supervision.ready_timeout + 60
        extra = (options or LaunchOptions()).argv()
        cluster_file = str(run.record().cluster_file)
        runctl.spawn_detached(cluster_file, run, str(run.dir.parent), timeout, extra)
        return run.id

    def check_options(self, options: LaunchOptions) -> None:
        """Refuse options of ``up`` this backend cannot honour here (LaunchError, exit 2)
        before anything starts, beyond the features its spec declares, which ``up`` checks
        first (local: the terminal program is installed). Default: nothing more; ``--down``
        has nothing to end."""
        return None

    def choose_ports(self, config: ClusterConfig, plan: Plan) -> Plan:
        """The plan a run starts (and ``validate`` checks) with its ports settled: the local
        backend gives the jobs whose base port the file leaves out free ports of this machine.
        Default: the plan's ports, counted up from the bases."""
        return plan

    def check_environment(self, config: ClusterConfig, environ: Mapping[str, str]) -> None:
        """Refuse to start where this environment would keep the run from working."""
        return None

    def check_here(self, config: ClusterConfig, plan: Plan) -> list[str]:
        """What ``validate`` can check from this machine before anything starts, beyond the
        file (``validate --offline`` skips it): one sentence per problem. Default: nothing."""
        return []

    def python(self, config: ClusterConfig) -> str:
        """The interpreter the tasks run under on the cluster's hosts. Default: this one."""
        return sys.executable

    def host_run_dir(self, config: ClusterConfig, run_id: str) -> str | None:
        """The run's directory as a path on the hosts, where they do not share this machine's
        files (ssh); None where they do (this machine, or Slurm's shared file system)."""
        return None

    def tensorboard(
        self, run: Run, logdir: str | None, port: int, remote_port: int, show: Any
    ) -> int:
        """``tflaunch tensorboard``: TensorBoard where the run's summaries are, reachable on
        local ``port``; its exit code. Default: here, over the run directory."""
        from tflaunch.launchers.tensorboard_serve import run_local

        return run_local(Path(logdir) if logdir else run.dir, port, show)

    def attach(self, run: Run) -> None:
        """``tflaunch attach``: open the run's terminal session. Default: it has none."""
        raise LaunchError(
            f"run {run.id} has no tmux session: it was started without '--terminals tmux'. "
            "Follow it with 'tflaunch logs RUN -f'."
        )

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
        raise TflaunchError(
            f"exec runs commands on the hosts of ssh runs; run {run.id} has backend {self.name}."
        )

    def cluster_alive(self, run: Run) -> bool | None:
        """Whether the run's coordinator (and so its cluster) is still running; None when this
        machine cannot tell (the launcher that coordinates it runs on another machine,
        container or PID namespace). Default: the run's recorded launcher."""
        from tflaunch.runtime import runctl

        return runctl.coordinator_alive(run)


def spawn_agent(run: Run, host: str, die_with_parent: bool) -> ProcessLink:
    """The agent of ``host`` as a child process of this one, speaking over its stdin/stdout.

    ``die_with_parent``: tied to this process by the parent-death signal (a Slurm node's agent);
    a local launcher's agent is not, so that it outlives a killed launcher just long enough to
    see its input close and tear its tasks down."""
    proc = procs.spawn(
        agent_argv(sys.executable, str(run.plan_path), host, str(run.dir)),
        os.environ,
        cwd=None,
        stdin=subprocess.PIPE,
        stderr=None,
        die_with_parent=die_with_parent,
        text=True,
    )
    return ProcessLink(host, proc)
