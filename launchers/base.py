"""The interface every backend fills in, and the pieces backends share.

A backend knows only how to find its hosts and how to start one agent per host and carry the
agent's JSON-lines stream; planning, supervision policy and run state are the same everywhere.
Backends whose coordinator runs in the launcher (local, ssh) use ``Backend.launch`` as is; Slurm
overrides it to submit a job whose first node coordinates.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from typing import IO, Any

from tflaunch.config import ClusterConfig
from tflaunch.coordinator import Coordinator, Outcome
from tflaunch.plan import Host, Plan
from tflaunch.run import Run


class StreamLink:
    """An agent reached through a pair of text streams (pipes of a subprocess, an SSH channel)."""

    def __init__(self, host: str, reader: IO[str], writer: IO[str]):
        self.host = host
        self._reader, self._writer = reader, writer
        self._lock = threading.Lock()

    def start_reader(self, sink: queue.Queue) -> None:
        threading.Thread(target=self._pump, args=(sink,), daemon=True).start()

    def _pump(self, sink: queue.Queue) -> None:
        try:
            for line in iter(self._reader.readline, ""):
                try:
                    event = json.loads(line)
                except ValueError:
                    event = {"event": "output", "task": f"agent@{self.host}", "line": line.rstrip()}
                sink.put((self.host, event))
        except (OSError, ValueError):
            pass  # the stream broke: reported as closed below
        sink.put((self.host, {"event": "link_closed"}))

    def send(self, command: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._writer.write(json.dumps(command) + "\n")
                self._writer.flush()
            except (OSError, ValueError):
                pass  # a dead agent's link closing is reported by the reader

    def close(self, timeout: float) -> None:
        with self._lock:
            try:
                self._writer.close()
            except (OSError, ValueError):
                pass


class ProcessLink(StreamLink):
    """A local agent subprocess."""

    def __init__(self, host: str, proc: subprocess.Popen):
        assert proc.stdout is not None and proc.stdin is not None
        super().__init__(host, proc.stdout, proc.stdin)
        self.proc = proc

    def close(self, timeout: float) -> None:
        super().close(timeout)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class Backend(ABC):
    """How one kind of infrastructure starts agents."""

    name: str = ""

    @abstractmethod
    def hosts(self, config: ClusterConfig) -> list[Host]:
        """The concrete hosts the plan is made for."""

    @abstractmethod
    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list:
        """Start one agent per host that has tasks; return their links."""

    def launch(self, config: ClusterConfig, plan: Plan, run: Run, on_ready: Any = None) -> Outcome:
        """Start the agents and coordinate the cluster until it ends."""
        run.update_meta(
            backend=self.name,
            state="starting",
            coordinator_pid=os.getpid(),
            started=time.time(),
            hosts=[h.name for h in plan.hosts_with_tasks()],
        )
        links = self.start_agents(config, plan, run)
        run.update_meta(state="running")
        try:
            outcome = Coordinator(plan, run, links, on_ready=on_ready).run_cluster()
        finally:
            for link in links:
                link.close(timeout=5)
        state = "succeeded" if outcome.code == 0 else "stopped" if outcome.interrupted else "failed"
        run.update_meta(
            state=state, exit_code=outcome.code, ended=time.time(), message=outcome.message
        )
        return outcome

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, cluster_file: str, run_root: str
    ) -> str:
        """Start the run in the background; return what ``up --detach`` prints (the run id).

        Default: a detached local coordinator, returning once the cluster is ready. Slurm
        returns once the job is submitted."""
        from tflaunch import runctl

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
        from tflaunch import runctl

        return runctl.stop_local_coordinator(run, grace)

    def cluster_alive(self, run: Run) -> bool:
        """Whether the run's coordinator (and so its cluster) is still running."""
        from tflaunch import runctl

        return runctl.coordinator_alive(run)
