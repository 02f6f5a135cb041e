"""Instances made for a run, owned from creation to termination (``ssh.provision``): the
cloud-neutral orchestration, for any provider (:mod:`tflaunch.launchers.clouds.base`), handed
in built once per ``up``.

The SSH backend asks it for a run's hosts: ``with Provisioning(...) as made:`` shows the cost,
creates the instances (or takes a kept cluster's), waits until they run and accept SSH, and hands
back ``made.plan``, the plan on their real addresses (the only plan written), on which the backend
launches once, with its usual sync, setup, pre-flight and agents; leaving the ``with`` ends the
instances as the run asked. The plan, made once on hosts whose addresses are pending, decides which
instances the run needs; their cost table is shown before any is created; then the provider opens
the cluster's network rules (its ports only between its members, SSH only from the launcher's
address) and creates one instance per planned host, tagged with the run, the cluster and the
launcher. No module here knows a backend: what it needs of SSH (the port, whether a jump host
stands between, the run's directory on the hosts) is handed in.

Instances are terminated (never stopped) when:

* anything fails before the cluster started (creation, waiting, setup, pre-flight) or the
  launcher is interrupted then: nothing useful runs on them;
* the run ends and ``up --down`` or ``ssh.provision.terminate_at_end`` asked for it (success,
  failure or Ctrl-C alike);
* ``tflaunch down RUN`` is given;
* ``tflaunch gc`` finds them belonging to a run that ended or whose launcher is gone;
* the host itself decides so: its user data starts a watchdog
  (:mod:`tflaunch.launchers.clouds.watchdog`) that powers the instance off at
  ``supervision.max_runtime`` and after ``ssh.provision.idle_timeout`` seconds without a tflaunch
  process or SSH session, and the provider makes a power-off a termination. So a forgotten run
  ends even if the laptop that started it is gone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import time
from collections.abc import Sequence

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.placement import checkpoint_dir, make_plan
from tflaunch.cluster.plan import Host, Plan
from tflaunch.errors import ConfigError, LaunchError, TflaunchError
from tflaunch.launchers.clouds import kept, provision_of, spec_of
from tflaunch.launchers.clouds.base import Feature, Provider, Say
from tflaunch.launchers.clouds.costs import cost_table
from tflaunch.launchers.clouds.fleet import Fleet
from tflaunch.launchers.clouds.records import (
    TAG_BUSY,
    TAG_IDLE_SINCE,
    TAG_KEEP,
    TAG_RUN,
    CloudDetails,
    Instance,
    PlannedInstance,
    mark_terminated,
    pending_hosts,
    write_access,
)
from tflaunch.launchers.clouds.state import ProvisionState, Reach
from tflaunch.runtime.run import Run
from tflaunch.runtime.signals import interrupting


class Interrupted(TflaunchError):
    """Ctrl-C, SIGTERM or SIGHUP while instances were being made (exit code as for SIGINT)."""

    exit_code = 130


def planned_instances(
    provider: Provider, config: ClusterConfig, plan: Plan | None = None
) -> list[PlannedInstance]:
    """The instances the plan places tasks on (``plan``: made on :func:`candidate_hosts`; when
    not given, it is made here)."""
    candidates = provider.candidates(config)
    if plan is None:
        plan = make_plan(config, pending_hosts(candidates))
    return provider.instances_for(candidates, plan)


def candidate_hosts(provider: Provider, config: ClusterConfig) -> list[Host]:
    """The hosts to plan a provisioned cluster on before its instances exist."""
    return pending_hosts(provider.candidates(config))


@dataclasses.dataclass(frozen=True)
class _Ending:
    """What becomes of the instances when the run ends."""

    detach: bool  # a detached run keeps them once started
    asked: bool  # up --down or terminate_at_end: terminate them however the run ends
    keep: str | None  # a kept cluster: they stay


class Provisioning:
    """One run's instances, as a context: entering shows the cost, creates the instances (or
    takes a kept cluster's), waits until they run and accept SSH and writes the plan on their
    addresses (:attr:`plan`); leaving ends them as the run asked: terminated when ``down_at_end``
    (``up --down``) or ``terminate_at_end`` says so, or whenever the cluster never started (a
    failure or Ctrl-C while they were made); else left running, marked idle, to 'down', 'gc'
    or their idle watchdog. A detached run (``detach``) keeps its instances once started.
    ``keep`` names the kept cluster to reuse or make (``up --keep``; ``recreate``: replace it
    when it does not fit), which stays; its lock is held from entering to leaving. With
    ``watch``, :attr:`fleet` replaces instances that end while the run goes on.

    ``provider``: the cluster file's ``ssh.provision`` provider, built once for the ``up``;
    ``plan``: the plan made on :func:`candidate_hosts` (made here when not given)."""

    def __init__(
        self,
        provider: Provider,
        config: ClusterConfig,
        run: Run,
        reach: Reach,
        *,
        plan: Plan | None = None,
        detach: bool = False,
        down_at_end: bool = False,
        keep: str | None = None,
        recreate: bool = False,
        watch: bool = False,
    ):
        section = provision_of(config)
        if section is None:
            raise ConfigError(f"{config.source}: no ssh.provision section: nothing to make.")
        spec = spec_of(provider.name)
        if keep:
            spec.require(Feature.KEEP, "up --keep")
        candidates = provider.candidates(config)
        if plan is None:
            plan = make_plan(config, pending_hosts(candidates))
        planned = provider.instances_for(candidates, plan)
        if any(p.spot for p in planned):
            spec.require(Feature.SPOT, provider.spot_setting or "spot instances")
        if len(planned) < len(candidates):  # placement on fewer hosts may differ
            plan = make_plan(config, pending_hosts(planned))
        self.pending_plan = plan
        self.lines = provider.cost_lines(planned)
        prices = {line.instance_type: line.price for line in self.lines}
        self.state = ProvisionState(
            section, config, run, reach, provider, tuple(planned), prices, keep
        )
        self.plan: Plan | None = None  # on the instances' addresses, once made
        self.end = _Ending(detach, down_at_end or section.terminate_at_end, keep)
        self.recreate, self.watch = recreate, watch
        self.fleet: Fleet | None = None
        self._lock: contextlib.ExitStack | None = None

    def __enter__(self) -> Provisioning:
        state = self.state
        notice = checkpoint_notice(
            state.provider, state.planned, state.config, self.pending_plan, state.reach.run_dir
        )
        if notice:
            state.say(notice)
        reuse: Sequence[Instance] = ()
        self._lock = contextlib.ExitStack()
        try:
            if state.keep:
                state.run.update_part(CloudDetails, keep_cluster=state.keep)
                self._lock.enter_context(
                    kept.in_use(state.provider, state.keep, f"run {state.run.id}", state.say)
                )
                reuse = _kept_instances(state, self.recreate)
            self._make(reuse)
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self) -> None:
        try:
            if self.fleet is not None:
                self.fleet.close()  # a replacement being created is in made.ids before the end
            _end(self.state, self.end)
        finally:
            if self._lock is not None:
                self._lock.close()

    def _make(self, reuse: Sequence[Instance]) -> None:
        state = self.state
        what = "the kept cluster" if reuse else "the instances this run creates"
        state.say(f"cost of {what}:\n" + cost_table(self.lines))
        try:
            with interrupting():
                hosts = self._reuse(reuse) if reuse else self._create()
                self.plan = make_plan(state.config, hosts, state.reach.run_dir)  # checkpoints
                state.run.write_plan(self.plan)
        except KeyboardInterrupt as err:
            raise Interrupted(
                f"interrupted ({err or 'SIGINT'}) while the instances were being made; those "
                "made so far are terminated below"
            ) from None
        if self.watch:
            self.fleet = Fleet(state)
        state.made.started = True  # the run is handed its hosts

    def _reuse(self, reuse: Sequence[Instance]) -> list[Host]:
        """Take the kept cluster's instances: mark them in use, record them, wait until they
        run."""
        state, made, provider = self.state, self.state.made, self.state.provider
        keep = state.keep or ""
        made.reused, made.ids = True, {i.host: i.id for i in reuse}
        made.network = _network_of(reuse)
        state.say(f"reusing kept cluster {keep}: {len(reuse)} instance(s), none created")
        _say_unfinished(reuse, keep, state.say)
        provider.tag(list(made.ids.values()), {TAG_BUSY: state.run.id})
        write_access(state.run, provider.name, provider.access(), made.network)
        if not kept.record_path(state.run.dir.parent, keep).exists():  # made elsewhere
            _write_kept(state, created_by=reuse[0].tags.get(TAG_RUN))
        state.record(state.planned, made.ids)
        return self._running()

    def _create(self) -> list[Host]:
        """Open the network rules, create the instances, wait until they run and accept SSH."""
        state, made, provider = self.state, self.state.made, self.state.provider
        ports = [t.port for t in self.pending_plan.tasks if t.port]
        made.network = provider.open_network(
            state.run.id, state.config.name, ports, state.reach.ssh_port, None,
            {TAG_KEEP: state.keep} if state.keep else None,  # for 'down --cluster' anywhere
        )  # fmt: skip
        write_access(state.run, provider.name, provider.access(), made.network)
        if state.keep:
            runs_root = state.run.dir.parent
            kept.known_hosts_of(runs_root, state.keep).unlink(missing_ok=True)  # old keys
            _write_kept(state, created_by=state.run.id)
        state.say(f"creating {len(state.planned)} instance(s) with network rules {made.network}")
        made.ids = provider.create(
            state.planned, state.run.id, state.config.name, made.network, state.tags,
            state.user_data,
        )  # fmt: skip
        state.record(state.planned, made.ids)
        hosts = self._running()
        state.reach.wait_for_ssh(hosts, state.section.ready_timeout, state.say)
        return hosts

    def _running(self) -> list[Host]:
        """The instances, once they run, as plan hosts."""
        state, ids = self.state, self.state.made.ids
        found = state.provider.wait_running(list(ids.values()), state.section.ready_timeout)
        return state.provider.hosts(state.planned, ids, found, state.reach.via_jump)


def _write_kept(state: ProvisionState, created_by: str | None) -> None:
    """This machine's record of the kept cluster (``down --cluster`` needs no more)."""
    provider = state.provider
    kept.write_record(
        state.run.dir.parent, state.keep or "", cloud=provider.name, access=provider.access(),
        network=state.made.network, idle_timeout=state.section.idle_timeout,
        created_by=created_by,
    )  # fmt: skip


def checkpoint_notice(
    provider: Provider,
    planned: Sequence[PlannedInstance],
    config: ClusterConfig,
    plan: Plan,
    run_dir: str,
) -> str | None:
    """What to say when the checkpoints would die with a spot instance: with spot workers
    the chief's host is a spot instance too, and a replacement starts with an empty disk, so the
    checkpoints must be on storage every instance shares. An absolute ``program.checkpoint_dir``
    (a shared mount, one trusts) or a URL (``gs://``, ``s3://``) is left alone. ``planned``: the
    instances the plan needs (:func:`planned_instances`); ``run_dir``: the run's directory on
    the hosts."""
    chosen = config.program.checkpoint_dir
    if not any(p.spot for p in planned) or (
        chosen and ("://" in chosen or posixpath.isabs(chosen))
    ):
        return None
    leader = next(
        (t for t in plan.tasks if t.job == "chief" or (t.job == "worker" and t.index == 0)), None
    )
    host = f" ({leader.host}, where {leader.job}:{leader.index} writes them)" if leader else ""
    where = (
        "program.checkpoint_dir" if chosen else "the default, in the run's directory on the hosts"
    )
    return (
        f"checkpoints: {checkpoint_dir(config, run_dir)} ({where}) is on each instance's own disk, "
        f"and with {provider.spot_setting} every worker host is a spot instance{host}. An "
        "instance that replaces a reclaimed one starts without them: the cluster restarts from "
        "step 0 if it was the chief's. Set program.checkpoint_dir to storage every instance "
        "shares: an absolute path on a shared mount, or a URL your program writes to "
        "(gs://..., s3://...)."
    )


def _kept_instances(state: ProvisionState, recreate: bool) -> list[Instance]:
    """The kept cluster's running instances when they fit the plan; none when there are none
    (or ``recreate`` terminated them). Refuses a plan they do not fit."""
    provider, keep = state.provider, state.keep or ""
    existing = kept.find(provider, keep)
    if existing and recreate:
        state.say(f"--recreate: terminating the {len(existing)} instance(s) of kept cluster {keep}")
        provider.terminate([i.id for i in existing], _network_of(existing))
        return []
    problems = kept.differences(state.planned, existing) if existing else []
    if problems:
        raise LaunchError(
            f"kept cluster '{keep}' does not fit this plan: {'; '.join(problems)}. "
            f"'tflaunch up --keep --recreate' replaces it; 'tflaunch down --cluster {keep}' "
            "ends it."
        )
    return existing


def _say_unfinished(instances: Sequence[Instance], keep: str, say: Say) -> None:
    """A run that marked the kept cluster busy and never marked it idle: a detached run (its
    end is not tagged, and it holds the lock only until started) or a launcher that was killed.
    If it still runs, it shares the hosts with the new one; say so."""
    busy = sorted({i.tags.get(TAG_BUSY, "") for i in instances} - {""})
    if busy:
        say(
            f"kept cluster {keep}: run {', '.join(busy)} marked its instances in use and did not "
            "mark them idle (a detached run, or a launcher that was killed); if it still runs, "
            "it shares the hosts with this one ('tflaunch down RUN' stops it)"
        )


def _network_of(instances: Sequence[Instance]) -> str | None:
    """The network rules a kept cluster's instances were made in (their run's own)."""
    for instance in instances:
        for network, label in instance.networks.items():
            if label.startswith("tflaunch-"):
                return network
    return None


def _end(state: ProvisionState, end: _Ending) -> None:
    """Terminate what the run made unless it is kept (a kept cluster, a started run that was
    not asked to end its machines, a detached run)."""
    made, say, idle_timeout = state.made, state.say, state.section.idle_timeout
    for host, old, new in made.replaced:
        say(f"replaced instance of {host}: {old} (ended) -> {new}")
    keep = end.keep
    in_use = end.detach and made.started  # a detached run goes on using them
    if keep and (made.started or made.reused):
        if not in_use:
            _mark_idle(state.provider, list(made.ids.values()), say)
        say(
            f"kept cluster {keep} keeps running: 'tflaunch down --cluster {keep}' terminates it "
            f"(it terminates itself after {idle_timeout:g} s idle)"
        )
        return
    if made.started and (end.detach or not end.asked):
        if not in_use:
            _mark_idle(state.provider, list(made.ids.values()), say)
        say(
            f"the instances keep running: 'tflaunch down {state.run.id}' terminates them (they "
            f"terminate themselves after {idle_timeout:g} s idle)"
        )
    elif made.ids or made.network:
        say(f"terminating {len(made.ids)} instance(s)")
        state.provider.terminate(list(made.ids.values()), made.network)
        mark_terminated(state.run)
        if keep:
            kept.record_path(state.run.dir.parent, keep).unlink(missing_ok=True)


def _mark_idle(provider: Provider, ids: Sequence[str], say: Say) -> None:
    """Record on the instances that their run ended now: 'status --cloud' shows them idle since
    then, from any machine, whether they answer or not."""
    try:
        provider.tag(ids, {TAG_IDLE_SINCE: f"{time.time():.0f}"}, remove=[TAG_BUSY])
    except TflaunchError as err:  # the run's outcome stands; only the listing loses its idle time
        say(f"could not record the instances' idle time: {err}")
