"""Instances made for a run, owned from creation to termination (``ssh.provision``): the
cloud-neutral provisioner, for any provider (:mod:`tflaunch.launchers.clouds.base`).

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
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan, checkpoint_dir, make_plan
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.launchers.clouds import kept, provider_for, provider_of_run, spec_for_section
from tflaunch.launchers.clouds.base import (
    ALIVE_STATES,
    GONE_STATES,
    TAG_AUTOSTOP,
    TAG_BUSY,
    TAG_IDLE_SINCE,
    TAG_KEEP,
    TAG_LAUNCHER,
    TAG_RUN,
    TAG_RUN_DIR,
    CloudDetails,
    Feature,
    Instance,
    PlannedInstance,
    Provider,
    access_part,
    pending_hosts,
)
from tflaunch.launchers.clouds.costs import Price, cost_table
from tflaunch.launchers.clouds.sweep import mark_terminated
from tflaunch.launchers.clouds.watchdog import user_data
from tflaunch.runtime.identity import Launcher
from tflaunch.runtime.run import Run
from tflaunch.text import aligned

Say = Callable[[str], None]
POLL_SECONDS = 2.0  # between SSH probes


class Interrupted(TflaunchError):
    """Ctrl-C, SIGTERM or SIGHUP while instances were being made (exit code as for SIGINT)."""

    exit_code = 130


@dataclasses.dataclass(frozen=True)
class Reach:
    """What the provisioner needs of the backend that uses the instances (SSH), handed in so
    that no cloud module knows a backend: the SSH port to wait on, whether a jump host stands
    between (then sshd is not reachable from here and the connect address may be private), and
    the run's directory on the hosts (for the plan's default checkpoint directory)."""

    ssh_port: int
    via_jump: bool
    run_dir: str


def planned_instances(
    section: Any, config: ClusterConfig, plan: Plan | None = None
) -> list[PlannedInstance]:
    """The instances the plan places tasks on (``plan``: made on :func:`candidate_hosts`; when
    not given, it is made here). ``section``: the file's ``ssh.provision``."""
    provider = provider_for(section, lambda _: None)
    candidates = provider.candidates(config)
    if plan is None:
        plan = make_plan(config, pending_hosts(candidates))
    return provider.instances_for(candidates, plan)


def candidate_hosts(section: Any, config: ClusterConfig) -> list[Host]:
    """The hosts to plan a provisioned cluster on before its instances exist."""
    return pending_hosts(provider_for(section, lambda _: None).candidates(config))


def wait_for_ssh(hosts: Sequence[Host], port: int, timeout: float, say: Say) -> None:
    """Wait until every host's sshd sends its banner, saying how many do as that changes."""
    deadline, started, ready, shown = time.monotonic() + timeout, time.monotonic(), set(), -1
    while True:
        for host in hosts:
            if host.name not in ready and _ssh_banner(host.connect_address, port):
                ready.add(host.name)
        if len(ready) != shown:
            say(
                f"instances accepting SSH: {len(ready)}/{len(hosts)} ({time.monotonic() - started:.0f} s)"
            )
            shown = len(ready)
        if len(ready) == len(hosts):
            return
        if time.monotonic() > deadline:
            missing = ", ".join(h.name for h in hosts if h.name not in ready)
            raise LaunchError(
                f"{missing} did not accept SSH on port {port} within {timeout:g} s "
                "(ssh.provision.ready_timeout); check the image runs sshd and ssh_from covers you."
            )
        time.sleep(POLL_SECONDS)


def _ssh_banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3) as sock:
            sock.settimeout(3)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt while instances are being made, so that the
    cleanup below runs for them as for Ctrl-C."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclasses.dataclass
class _Made:
    """What a provisioned run made or took so far, for the cleanup."""

    ids: dict[str, str] = dataclasses.field(default_factory=dict)
    group: str | None = None
    reused: bool = False
    started: bool = False
    replaced: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # host, old, new


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

    ``plan``: the plan made on :func:`candidate_hosts` (made here when not given)."""

    def __init__(
        self,
        section: Any,
        config: ClusterConfig,
        run: Run,
        reach: Reach,
        say: Say,
        *,
        plan: Plan | None = None,
        detach: bool = False,
        down_at_end: bool = False,
        keep: str | None = None,
        recreate: bool = False,
        watch: bool = False,
    ):
        spec = spec_for_section(section)
        if keep:
            spec.require(Feature.KEEP, "up --keep")
        self.section, self.config, self.run, self.reach, self.say = section, config, run, reach, say
        self.provider = spec.load()(section, say)
        candidates = self.provider.candidates(config)
        if plan is None:
            plan = make_plan(config, pending_hosts(candidates))
        self.planned = self.provider.instances_for(candidates, plan)
        if any(p.spot for p in self.planned):
            spec.require(Feature.SPOT, self.provider.spot_setting or "spot instances")
        if len(self.planned) < len(candidates):  # placement on fewer hosts may differ
            plan = make_plan(config, pending_hosts(self.planned))
        self.pending_plan = plan
        self.plan: Plan | None = None  # on the instances' addresses, once made
        self.end = _Ending(detach, down_at_end or section.terminate_at_end, keep)
        self.recreate, self.watch = recreate, watch
        self.made = _Made()
        self.fleet: Fleet | None = None
        self._lock: contextlib.ExitStack | None = None

    def __enter__(self) -> Provisioning:
        notice = checkpoint_notice(self.section, self.config, self.pending_plan, self.reach.run_dir)
        if notice:
            self.say(notice)
        keep, run = self.end.keep, self.run
        reuse: Sequence[Instance] = ()
        self._lock = contextlib.ExitStack()
        try:
            if keep:
                run.update_part(CloudDetails, keep_cluster=keep)  # the kept cluster's instances
                self._lock.enter_context(
                    kept.in_use(self.provider, keep, f"run {run.id}", self.say)
                )
                reuse = _kept_instances(
                    self.provider, keep, self.planned, self.recreate, run, self.say
                )
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
            _end(self.run, self.provider, self.made, self.end, self.section.idle_timeout, self.say)
        finally:
            if self._lock is not None:
                self._lock.close()

    def _make(self, reuse: Sequence[Instance]) -> None:
        config, run, say, provider = self.config, self.run, self.say, self.provider
        section, keep, made, planned = self.section, self.end.keep, self.made, self.planned
        lines = provider.cost_lines(planned)
        what = "the kept cluster" if reuse else "the instances this run creates"
        say(f"cost of {what}:\n" + cost_table(lines))
        prices = {line.instance_type: line.price for line in lines}
        try:
            with _signals_interrupt():
                if reuse:
                    made.reused, made.ids = True, {i.host: i.id for i in reuse}
                    made.group = _network_of(reuse)
                    say(f"reusing kept cluster {keep}: {len(reuse)} instance(s), none created")
                    _say_unfinished(reuse, keep, say)
                    provider.tag(list(made.ids.values()), {TAG_BUSY: run.id})
                    _record_access(run, provider, made.group)
                    if not kept.record_path(run.dir.parent, keep).exists():  # made elsewhere
                        kept.write_record(
                            run.dir.parent, keep, cloud=provider.name, access=provider.access(),
                            network=made.group, idle_timeout=section.idle_timeout,
                            created_by=reuse[0].tags.get(TAG_RUN),
                        )  # fmt: skip
                    _record(run, planned, made.ids, prices, keep)
                    found = provider.wait_running(list(made.ids.values()), section.ready_timeout)
                    hosts = provider.hosts(planned, made.ids, found, self.reach.via_jump)
                else:
                    hosts = self._create(prices)
                self.plan = make_plan(config, hosts, self.reach.run_dir)  # its checkpoints
                run.write_plan(self.plan)
        except KeyboardInterrupt as err:
            raise Interrupted(
                f"interrupted ({err or 'SIGINT'}) while the instances were being made; those "
                "made so far are terminated below"
            ) from None
        if self.watch:
            self.fleet = Fleet(
                section, config, run, self.reach, provider, planned, made, prices, keep, say
            )
        made.started = True  # the run is handed its hosts

    def _create(self, prices: dict[str, Price]) -> list[Host]:
        """Open the network rules, create the instances, wait until they run and accept SSH."""
        config, run, provider, made = self.config, self.run, self.provider, self.made
        section, keep, planned, say = self.section, self.end.keep, self.planned, self.say
        ports = [t.port for t in self.pending_plan.tasks if t.port]
        made.group = provider.open_network(
            run.id, config.name, ports, self.reach.ssh_port, None,
            {TAG_KEEP: keep} if keep else None,  # found by 'down --cluster' from any machine
        )  # fmt: skip
        _record_access(run, provider, made.group)
        extra = {
            TAG_LAUNCHER: Launcher.current().tag(),
            TAG_RUN_DIR: str(run.dir),
            TAG_AUTOSTOP: f"{section.idle_timeout:g}",
            TAG_BUSY: run.id,
        }
        if keep:
            extra[TAG_KEEP] = keep
            kept.known_hosts_of(run.dir.parent, keep).unlink(missing_ok=True)  # keys of the past
            kept.write_record(
                run.dir.parent, keep, cloud=provider.name, access=provider.access(),
                network=made.group, idle_timeout=section.idle_timeout, created_by=run.id,
            )  # fmt: skip
        data = user_data(config.supervision.max_runtime, section.idle_timeout)
        say(f"creating {len(planned)} instance(s) in security group {made.group}")
        made.ids = provider.create(planned, run.id, config.name, made.group, extra, data)
        _record(run, planned, made.ids, prices, keep)
        found = provider.wait_running(list(made.ids.values()), section.ready_timeout)
        hosts = provider.hosts(planned, made.ids, found, self.reach.via_jump)
        if not self.reach.via_jump:  # behind a jump host sshd is not reachable from here
            wait_for_ssh(hosts, self.reach.ssh_port, section.ready_timeout, say)
        return hosts


def checkpoint_notice(section: Any, config: ClusterConfig, plan: Plan, run_dir: str) -> str | None:
    """What to say when the checkpoints would die with a spot instance: with spot workers
    the chief's host is a spot instance too, and a replacement starts with an empty disk, so the
    checkpoints must be on storage every instance shares. An absolute ``program.checkpoint_dir``
    (a shared mount, one trusts) or a URL (``gs://``, ``s3://``) is left alone. ``run_dir``:
    the run's directory on the hosts; ``section``: the file's ``ssh.provision``."""
    chosen = config.program.checkpoint_dir
    provider = provider_for(section, lambda _: None)
    spot = any(p.spot for p in provider.instances_for(provider.candidates(config), plan))
    if not spot or (chosen and ("://" in chosen or posixpath.isabs(chosen))):
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


def _kept_instances(
    provider: Provider,
    keep: str,
    planned: Sequence[PlannedInstance],
    recreate: bool,
    run: Run,
    say: Say,
) -> list[Instance]:
    """The kept cluster's running instances when they fit the plan; none when there are none
    (or ``recreate`` terminated them). Refuses a plan they do not fit."""
    existing = kept.find(provider, keep)
    if existing and recreate:
        say(f"--recreate: terminating the {len(existing)} instance(s) of kept cluster {keep}")
        provider.terminate([i.id for i in existing], _network_of(existing))
        return []
    problems = kept.differences(planned, existing) if existing else []
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


def _end(
    run: Run, provider: Provider, made: _Made, end: _Ending, idle_timeout: float, say: Say
) -> None:
    """Terminate what the run made unless it is kept (a kept cluster, a started run that was
    not asked to end its machines, a detached run)."""
    for host, old, new in made.replaced:
        say(f"replaced instance of {host}: {old} (ended) -> {new}")
    keep = end.keep
    in_use = end.detach and made.started  # a detached run goes on using them
    if keep and (made.started or made.reused):
        if not in_use:
            _mark_idle(provider, list(made.ids.values()), say)
        say(
            f"kept cluster {keep} keeps running: 'tflaunch down --cluster {keep}' terminates it "
            f"(it terminates itself after {idle_timeout:g} s idle)"
        )
        return
    if made.started and (end.detach or not end.asked):
        if not in_use:
            _mark_idle(provider, list(made.ids.values()), say)
        say(
            f"the instances keep running: 'tflaunch down {run.id}' terminates them (they "
            f"terminate themselves after {idle_timeout:g} s idle)"
        )
    elif made.ids or made.group:
        say(f"terminating {len(made.ids)} instance(s)")
        provider.terminate(list(made.ids.values()), made.group)
        mark_terminated(run)
        if keep:
            kept.record_path(run.dir.parent, keep).unlink(missing_ok=True)


def _mark_idle(provider: Provider, ids: Sequence[str], say: Say) -> None:
    """Record on the instances that their run ended now: 'status --cloud' shows them idle since
    then, from any machine, whether they answer or not."""
    try:
        provider.tag(ids, {TAG_IDLE_SINCE: f"{time.time():.0f}"}, remove=[TAG_BUSY])
    except TflaunchError as err:  # the run's outcome stands; only the listing loses its idle time
        say(f"could not record the instances' idle time: {err}")


class Fleet:
    """A provisioned run's instances while it runs: which ended (the provider says so), and
    their replacement by an instance of the same host name, role and type that takes the
    ended one's cluster address (so the plan stays true), waits until it runs and accepts SSH,
    and is recorded in run.json. Bounded by the cluster restarts the coordinator allows."""

    def __init__(
        self,
        section: Any,
        config: ClusterConfig,
        run: Run,
        reach: Reach,
        provider: Provider,
        planned: Sequence[PlannedInstance],
        made: _Made,
        prices: dict[str, Price],
        keep: str | None,
        say: Say,
    ):
        self.section, self.config, self.run, self.reach = section, config, run, reach
        self.provider, self.say = provider, say
        self.planned = {p.name: p for p in planned}
        self.made, self.prices, self.keep = made, prices, keep
        self._lock = threading.Lock()
        self._creating = threading.Lock()  # held while a replacement is created and recorded
        self._closed = False  # the run ended: no more replacements

    def ended(self) -> dict[str, str]:
        """Host -> why, for every instance of the run that is ending or ended."""
        with self._lock:
            ids = dict(self.made.ids)
        listed = {
            i.id: i
            for i in self.provider.describe(
                ids=list(ids.values()), states=(*ALIVE_STATES, *GONE_STATES)
            )
        }
        gone = {}
        for host, instance_id in ids.items():
            instance = listed.get(instance_id)
            state = instance.state if instance is not None else "gone"
            if state not in ("pending", "running"):
                gone[host] = f"its instance {instance_id} is {state}, says {self.provider.name}"
        return gone

    def replacing(self, host: str) -> str:
        """What replacing ``host``'s instance does, in words."""
        planned = self.planned[host]
        spot = "spot " if planned.spot else ""
        return f"creating a replacement {spot}instance ({planned.instance_type})"

    def replace(self, host: str, deadline: float) -> tuple[Host, str, str]:
        """A new instance for ``host`` (running, accepting SSH); returns it, the old id and
        the new id. Refuses when the old instance still runs, or once the run ended."""
        with self._creating:
            new_id, old_id = self._create_replacement(host)
        timeout = max(1.0, deadline - time.monotonic())
        planned = self.planned[host]
        found = self.provider.wait_running([new_id], timeout)
        (made,) = self.provider.hosts([planned], {host: new_id}, found, self.reach.via_jump)
        if not self.reach.via_jump:
            left = max(1.0, deadline - time.monotonic())
            wait_for_ssh([made], self.reach.ssh_port, left, self.say)
        return made, old_id, new_id

    @property
    def ready_timeout(self) -> float:
        """Seconds an instance may take to run and accept SSH (``ssh.provision``'s)."""
        return self.section.ready_timeout

    def close(self) -> None:
        """The run ends: wait for a replacement being created (so that it is among the run's
        instances when they are terminated or kept), and refuse any further one."""
        with self._creating:
            self._closed = True

    def _create_replacement(self, host: str) -> tuple[str, str]:
        """Create and record the new instance for ``host``; its id and the old one's."""
        if self._closed:
            raise LaunchError(f"the run ended; {host} is not replaced")
        with self._lock:
            old_id = self.made.ids[host]
        listed = self.provider.describe(ids=[old_id], states=(*ALIVE_STATES, *GONE_STATES))
        old = listed[0] if listed else None
        if old is not None and old.state in ("pending", "running"):
            raise LaunchError(f"{host} stopped answering, but its instance {old_id} still runs.")
        if old is not None and old.state != "terminated":  # stopped or stopping: end it for good
            self.provider.terminate([old_id])
        planned = self.planned[host]
        extra = {TAG_LAUNCHER: Launcher.current().tag(), TAG_RUN_DIR: str(self.run.dir)}
        section = self.section
        extra[TAG_AUTOSTOP] = f"{section.idle_timeout:g}"
        extra[TAG_BUSY] = self.run.id
        if self.keep:
            extra[TAG_KEEP] = self.keep
        data = user_data(self.config.supervision.max_runtime, section.idle_timeout)
        same = {host: old} if old is not None else None
        created = self.provider.create(
            [planned], self.run.id, self.config.name, self.made.group or "", extra, data, same
        )
        new_id = created[host]
        self.say(f"{host}: replacement instance {new_id} created (for {old_id}); waiting for it")
        with self._lock:
            self.made.ids[host] = new_id
            self.made.replaced.append((host, old_id, new_id))
            self._record_replacement(planned, old_id, new_id)
        return new_id, old_id

    def _record_replacement(self, planned: PlannedInstance, old_id: str, new_id: str) -> None:
        mark_terminated(self.run, {old_id})
        records = self.run.record().part(CloudDetails).instances
        _record(self.run, [planned], {planned.name: new_id}, self.prices, self.keep, records)


def fleet_of_run(section: Any, config: ClusterConfig, run: Run, reach: Reach, say: Say) -> Fleet:
    """The :class:`Fleet` of a run started earlier (a detached run, watched from the laptop):
    its instances and prices from run.json and the provider, ``config`` its cluster file and
    ``section`` the file's ``ssh.provision`` (types, image, spot, ...)."""
    record = run.record()
    provider = provider_for(section, say)
    access = getattr(record.part(access_part(provider.name)), provider.name)
    if not access:
        raise LaunchError(f"run {run.id} made no instances: there is nothing to watch")
    cloud = record.part(CloudDetails)
    planned = provider.instances_for(provider.candidates(config), run.read_plan())
    live = [r for r in cloud.instances if r.get("terminated") is None]
    made = _Made(
        ids={r["name"]: r["id"] for r in live},
        group=access.get("security_group"),
        started=True,
    )
    prices = {line.instance_type: line.price for line in provider.cost_lines(planned)}
    return Fleet(
        section, config, run, reach, provider, planned, made, prices, cloud.keep_cluster, say
    )


def _record(
    run: Run,
    planned: Sequence[PlannedInstance],
    ids: dict[str, str],
    prices: dict[str, Price],
    keep: str | None,
    before: Sequence[dict[str, Any]] = (),
) -> None:
    now = time.time()
    made = [
        {"id": ids[p.name], "name": p.name, "type": p.instance_type, "role": p.role,
         "spot": p.spot, "hourly_usd": prices[p.instance_type].hourly_usd,
         "launched": now, "terminated": None, **({"kept": keep} if keep else {})}
        for p in planned if p.name in ids
    ]  # fmt: skip
    run.update_part(CloudDetails, instances=[*before, *made])


def _record_access(run: Run, provider: Provider, group: str | None) -> None:
    """How ``down`` and ``gc`` reach the run's account and network rules again."""
    access = {**provider.access(), "security_group": group}
    run.update_part(access_part(provider.name), **{provider.name: access})


def terminate_run(run: Run, say: Say) -> str:
    """``tflaunch down``: terminate the instances a run created; what was done, in words."""
    record = run.record()
    provider: Provider | None = provider_of_run(record, say)
    if provider is None:
        return ""
    keep = record.part(CloudDetails).keep_cluster
    if keep:
        return f"kept cluster {keep} keeps running: 'tflaunch down --cluster {keep}' ends it"
    alive = provider.describe(tags={TAG_RUN: run.id})
    access = getattr(record.part(access_part(provider.name)), provider.name)
    provider.terminate([i.id for i in alive], access.get("security_group"))
    mark_terminated(run)
    return f"terminated {len(alive)} instance(s) of run {run.id}"


def instance_lines(run: Run, say: Say, unwatched: bool = False) -> list[str]:
    """For ``status RUN``: the run's instances, their state now (from the provider) and price.
    ``unwatched`` (a detached run without a watcher: its coordinator has no cloud credentials,
    and nothing replaces an instance that ends) adds a warning for each instance that ended by
    itself."""
    record = run.record()
    records = record.part(CloudDetails).instances
    provider = provider_of_run(record, say) if records else None
    if provider is None:
        return []
    try:
        listed = provider.describe(
            ids=[r["id"] for r in records], states=(*ALIVE_STATES, *GONE_STATES)
        )
        states = {i.id: i.state for i in listed}
        unlisted = "gone"
    except TflaunchError as err:  # no credentials or no network now: what run.json knows
        say(f"cannot ask {provider.name} for the instances' states: {err}")
        states, unlisted = {}, "?"
    rows = [("HOST", "INSTANCE", "TYPE", "ROLE", "STATE", "USD/HOUR")]
    for r in records:
        hourly = r.get("hourly_usd")
        rows.append((
            r["name"], r["id"], r["type"], r["role"] + (" spot" if r.get("spot") else ""),
            states.get(r["id"], unlisted) + (f" (kept cluster {r['kept']})" if r.get("kept") else ""),
            "?" if hourly is None else f"{hourly:.4f}",
        ))  # fmt: skip
    lines = ["instances:", *("  " + line for line in aligned(rows))]
    if unwatched:
        lines += _unwatched_losses(run, provider.name, records, states)
    return lines


def _unwatched_losses(
    run: Run, cloud: str, records: Sequence[dict[str, Any]], states: dict[str, str]
) -> list[str]:
    """A warning for each instance of a detached run that ended without tflaunch ending it."""
    lost = [
        r
        for r in records
        if r.get("terminated") is None
        and r["id"] in states
        and states[r["id"]] not in ("pending", "running")
    ]
    if not lost:
        return []
    ended = ", ".join(f"{r['name']} ({r['id']}, {states[r['id']]})" for r in lost)
    return [
        f"lost: the instance(s) of {ended} ended, says {cloud}, and nothing replaces them: a "
        "detached run's coordinator runs on a host without cloud credentials, and this run "
        "has no watcher here (one is started by 'up --detach' only with a restart policy in "
        "supervision.restart). Its coordinator notices the lost host only when its connection "
        f"times out; 'tflaunch down {run.id}' stops the run and terminates its instances."
    ]
