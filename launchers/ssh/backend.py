"""SSH backend: one agent per host, started over paramiko, its event stream carried back.

The launcher connects to every host's *connect* (public) address in parallel, while the plan wires
the cluster on *cluster* (private) addresses. Before anything starts anywhere each host, in a
pipeline of its own (:mod:`tflaunch.launchers.ssh.session`), uploads the files ``ssh.upload``
lists (SFTP) and runs the pre-flight probe (:mod:`tflaunch.launchers.ssh.preflight`), which also
makes the host's run directory and writes its plan; one table shows every host. The probe then
waits on its SSH channel (no PTY); once every host passed, it becomes the host's agent in the same
process (``tflaunch.launchers.agent.main``): the channel's stdout is the agent's JSON-lines event stream and
its stdin carries the coordinator's commands and heartbeats.

No orphans: a channel without a PTY does not kill its remote process, and sshd notices a cut link
only after TCP gives up, so the agent itself stops its tasks when its input closes *or* when no
heartbeat arrived for ``supervision.heartbeat_timeout`` seconds. The launcher in turn probes every
connection (:mod:`tflaunch.launchers.ssh.link`: an SSH global request, like
``ServerAliveInterval``) and reports a host whose
connection stopped answering as lost, which fails the run — unless ``ssh.host_wait`` is
set: then once the lost host accepts a connection again (within ``host_wait``) a new agent is
started there (:mod:`tflaunch.launchers.ssh.revive`) from the plan in its run directory, which starts its tasks, alone when their
roles' restart scope allows, else with the whole cluster (see
:mod:`tflaunch.runtime.coordinator`). A provisioned run also asks the provider every few seconds
whether its instances still run, and replaces an ended one (same host name, role, type and
cluster address) the same way (:mod:`tflaunch.launchers.clouds.provisioning` makes the instances
and hands this backend their plan, on which it launches once); for a detached one, a watcher left
on the laptop does (:mod:`tflaunch.launchers.ssh.watch`; it also restarts the run when the instance of the
coordinator's own host ends). ``ssh.host_wait`` is for attached runs only: a detached run's
coordinator on its host fails the run when a host stops answering.

Per-task logs stay in the host's run directory (``<remote run dir>/<run id>/<host>/``) and are
copied into the local run directory when the run ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tflaunch.launchers.ssh import detached
from tflaunch.launchers.ssh.connect import (
    Connection,
    Unreachable,
    parallel,
)
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.launchers.ssh.link import SshLink
from tflaunch.launchers.ssh.revive import SshRevival
from tflaunch.launchers.ssh.section import SshSection, host_run_dir
from tflaunch.launchers.ssh.session import HostSession
from tflaunch.launchers.ssh.sources import resolve_hosts
from tflaunch.plugin import (
    Backend,
    ClusterConfig,
    Host,
    LaunchError,
    LaunchOptions,
    Outcome,
    Plan,
    Revive,
    Run,
    TflaunchError,
    TraceSite,
)
from tflaunch.runtime import procs, protocol

WATCH_SECONDS = 3.0  # between asking the provider whether a provisioned run's instances run


class SshBackend(Backend):
    name = "ssh"

    def __init__(self) -> None:
        self.session = HostSession()
        self.fleet: Any = None  # a provisioned run's instances (clouds.fleet.Fleet) while it runs
        self.provider: Any = None  # ssh.provision's cloud, built once per 'up' (by hosts)
        self._links: dict[str, SshLink] = {}
        self._watching = threading.Event()

    def hosts(self, config: ClusterConfig) -> list[Host]:
        if self.hosts_pending(config):  # instances not made yet: addresses pending
            from tflaunch.launchers.clouds.provisioning import candidate_hosts
            from tflaunch.launchers.ssh import cloud

            self.provider = cloud.provider(config, self.session.say)
            return candidate_hosts(self.provider, config)
        return resolve_hosts(config)

    def hosts_pending(self, config: ClusterConfig) -> bool:
        """Whether the run makes its hosts (``ssh.provision``): the one test of it here."""
        return config.section(SshSection).provision is not None

    def check_here(self, config: ClusterConfig, plan: Plan) -> list[str]:
        """Every host's connect address resolves here (the rest, pre-flight checks on the
        hosts at 'up'); nothing for instances not made yet."""
        if self.hosts_pending(config):
            return []
        names = (h.connect_address for h in plan.hosts_with_tasks())
        return procs.unresolved(names, "fix hosts: (or the host file), or /etc/hosts")

    # ---- attached runs: the launcher is the coordinator ------------------------------------

    def launch(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> Outcome:
        from tflaunch.launchers.ssh import limits

        options = options or LaunchOptions()
        try:
            with contextlib.ExitStack() as stack:  # a provisioned run's instances end last
                if self.hosts_pending(config):  # make the instances: the run's hosts
                    plan = stack.enter_context(self._provisioning(config, plan, run, options))
                try:
                    with limits.runtime_limit(config.supervision.max_runtime, self.session.say):
                        return super().launch(config, plan, run, options)
                finally:
                    self._watching.set()  # the watch on the instances ends with the run
                    try:
                        self.session.fetch_logs(plan, run)
                    finally:
                        self.session.close()
        except TflaunchError as err:
            if not run.ended:
                run.finish(Outcome(err.exit_code, str(err)))
            raise

    @contextlib.contextmanager
    def _provisioning(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions
    ) -> Iterator[Plan]:
        """The run's instances (:mod:`tflaunch.launchers.clouds.provisioning`) for the time of
        the run: their plan, reached with the run's own known_hosts; the fleet replaces those
        that end."""
        from tflaunch.launchers.clouds.provisioning import Provisioning
        from tflaunch.launchers.ssh import cloud

        keep = config.name if options.keep else None
        provisioning = Provisioning(
            self.provider or cloud.provider(config, self.session.say), config, run,
            cloud.reach(config, run.id), plan=plan, down_at_end=options.down_at_end, keep=keep,
            recreate=options.recreate, watch=True,
        )  # fmt: skip
        with provisioning as made:
            self.session.options = cloud.instance_options(config, run, keep)
            self.fleet = made.fleet
            assert made.plan is not None
            yield made.plan

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list[SshLink]:
        """Connect, prepare and check every host; only if all pass, start one agent on each."""
        self.session.open(config, plan, run, keep_probes=True)
        heartbeat = plan.supervision.heartbeat
        timeout = plan.supervision.heartbeat_timeout

        def start(conn: Connection) -> SshLink:
            # each host's probe, waiting on its channel since pre-flight, becomes its agent
            channel = self.session.start_agent(conn.name)
            return SshLink(conn.name, conn, channel, heartbeat, timeout)

        results = parallel(start, self.session.connections.values())
        links = [link for _, link, err in results if err is None]
        failures = [f"{c.name}: {err}" for c, _, err in results if err is not None]
        if failures:
            for link in links:
                link.send(protocol.Stop(reason="another host failed to start").wire())
                link.close(timeout=10)
            self.session.end_probes()
            raise LaunchError("cannot start the agents:\n  " + "\n  ".join(failures))
        self._links.clear()  # (kept current by the revival, for the instance watch)
        self._links.update({link.host: link for link in links})
        if self.fleet is not None:
            threading.Thread(target=self._watch_instances, daemon=True).start()
        return links

    def _watch_instances(self) -> None:
        """(thread) Report the host of an instance that ended (the provider says so) lost, so
        that the coordinator stops the cluster and the reviver replaces the instance."""
        reported: dict[str, str] = {}
        while not self._watching.wait(WATCH_SECONDS):
            with contextlib.suppress(TflaunchError):  # the provider did not answer: next round
                for host, why in self.fleet.ended().items():
                    link = self._links.get(host)
                    if link is not None and reported.get(host) != why:
                        reported[host] = why
                        link.report_lost(why)

    def reviver(self, config: ClusterConfig, plan: Plan, run: Run) -> Revive | None:
        """A lost host's new agent (:mod:`tflaunch.launchers.ssh.revive`): the same host
        again (``ssh.host_wait``), or a new instance in a provisioned run."""
        return SshRevival(self.session, self._links, self.fleet, config, plan, run).revive()

    # ---- detached runs: the coordinator runs on one of the hosts ----------------------------

    def detach(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> str:
        """``up --detach``: the run lives on the hosts; the laptop may disconnect."""
        if self.hosts_pending(config):  # make the instances; they outlive this command
            return detached.launch_provisioned(
                self.session, config, plan, run, options or LaunchOptions(), self.provider
            )
        return detached.launch(self.session, config, plan, run)

    # ---- up --trace ------------------------------------------------------------------------

    def trace_site(self, config: ClusterConfig, plan: Plan, run: Run) -> TraceSite | None:
        """The capture on the leader's host, its result through the run's connections
        (:mod:`tflaunch.launchers.ssh.trace`): the launcher reaches no task's profiler port.
        (A detached run's coordinator, on the first host, uses the plain site:
        :mod:`tflaunch.launchers.ssh.on_host`.)"""
        from tflaunch.launchers.ssh.trace import SshTraceSite

        return SshTraceSite(self.session, plan, run, config.section(SshSection).python)

    # ---- what other commands ask of an SSH run --------------------------------------------

    def python(self, config: ClusterConfig) -> str:
        return config.section(SshSection).python

    def host_run_dir(self, config: ClusterConfig, run_id: str) -> str:
        return host_run_dir(config, run_id)

    def tensorboard(
        self, run: Run, logdir: str | None, port: int, remote_port: int, show: Any
    ) -> int:
        """On the first worker's host, forwarded to ``port`` here (the SSH settings come from
        the run's cluster file)."""
        from tflaunch.launchers.ssh.tensorboard_remote import run_ssh
        from tflaunch.launchers.tensorboard_serve import TensorBoardError
        from tflaunch.plugin import load_config

        cluster_file = run.record().cluster_file
        if not cluster_file or not Path(cluster_file).exists():
            raise TensorBoardError(
                f"run {run.id} was started from {cluster_file}, which is gone: the SSH settings "
                "to reach its hosts are in it."
            )
        config = load_config(cluster_file)
        return run_ssh(run, config, port, remote_port, show, logdir)

    def describe(self, run: Run) -> list[str]:
        """For ``status``: refresh a detached run from its hosts first; say where it runs, and
        list the instances it made or took (ssh.provision)."""
        from tflaunch.launchers.clouds.listing import instance_lines

        details = run.record().part(SshDetails)
        unwatched = details.detached and not details.ssh_watcher_pid
        instances = instance_lines(run, self.session.say, unwatched=unwatched)
        if not details.detached:
            return instances
        self.refresh(run)
        return [
            f"detached: coordinator on {details.ssh_coordinator} "
            f"(pid {details.ssh_coordinator_pid})",
            *instances,
        ]

    def refresh(self, run: Run) -> None:
        """Bring a detached run's events, state and logs from the hosts into the run dir."""
        if run.record().part(SshDetails).detached:
            detached.refresh(self.session, run)

    def cluster_alive(self, run: Run) -> bool | None:
        if not run.record().part(SshDetails).detached:
            return super().cluster_alive(run)
        ended_before = run.ended
        self.refresh(run)
        # Alive for one more round after the end was copied, so that readers (logs -f) get the
        # last lines this refresh brought.
        return not ended_before

    def down(self, run: Run, grace: float) -> str:
        from tflaunch.launchers.clouds.admin import terminate_run

        if not run.record().part(SshDetails).detached:
            stopped = super().down(run, grace)
        else:
            try:
                stopped = detached.down(self.session, run, grace)
            except Unreachable as err:  # the account alone ends the instances, if they are ours
                return detached.down_unreachable(
                    run, err, lambda: terminate_run(run, self.session.say)
                )
        return "; ".join(s for s in (stopped, terminate_run(run, self.session.say)) if s)

    def exec_command(self, run: Run, argv: Sequence[str], show: Any) -> int:
        from tflaunch.launchers.ssh.remote_exec import exec_on_hosts

        return exec_on_hosts(self.session, run, argv, show)
