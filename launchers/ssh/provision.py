"""Instances made for a run, owned from creation to termination (``ssh.provision``).

The SSH backend's side of provisioning; the cloud itself is a provider
(:mod:`tflaunch.launchers.clouds`) that the cluster file names. The plan, made once on hosts
whose addresses are pending, decides which instances the run needs; their cost table is shown
before any is created; then the provider opens the cluster's network rules (its ports only
between its members, SSH only from the launcher's address) and creates one instance per planned
host, tagged with the run, the cluster and the launcher. The run waits until every instance runs
and accepts SSH, plans again on the real addresses (the only plan written), and goes on to the
SSH backend's usual sync, setup, pre-flight and launch.

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

import dataclasses
import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan, make_plan
from tflaunch.errors import LaunchError, TflaunchError
from tflaunch.launchers.clouds import provider_for, provider_of_run
from tflaunch.launchers.clouds.base import (
    TAG_LAUNCHER,
    TAG_RUN,
    TAG_RUN_DIR,
    PlannedInstance,
    Provider,
    pending_hosts,
)
from tflaunch.launchers.clouds.costs import Price, cost_table
from tflaunch.launchers.clouds.sweep import launcher_tag, mark_terminated
from tflaunch.launchers.clouds.watchdog import user_data
from tflaunch.runtime.run import Run

Say = Callable[[str], None]
POLL_SECONDS = 2.0  # between SSH probes


class Interrupted(TflaunchError):
    """Ctrl-C, SIGTERM or SIGHUP while instances were being made (exit code as for SIGINT)."""

    exit_code = 130


def planned_instances(config: ClusterConfig, plan: Plan | None = None) -> list[PlannedInstance]:
    """The instances the plan places tasks on (``plan``: made on :func:`candidate_hosts`; when
    not given, it is made here)."""
    provider = provider_for(config, lambda _: None)
    candidates = provider.candidates(config)
    if plan is None:
        plan = make_plan(config, pending_hosts(candidates))
    return provider.instances_for(candidates, plan)


def candidate_hosts(config: ClusterConfig) -> list[Host]:
    """The hosts to plan a provisioned cluster on before its instances exist."""
    return pending_hosts(provider_for(config, lambda _: None).candidates(config))


def my_public_cidr() -> str:
    """This machine's public address as a /32 (asked of checkip.amazonaws.com)."""
    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as reply:
            address = reply.read().decode().strip()
        socket.inet_aton(address)
    except (OSError, ValueError) as err:
        raise LaunchError(
            f"cannot learn this machine's public address for the SSH rule ({err}); set "
            "ssh.provision.ssh_from to the CIDR you connect from, e.g. 203.0.113.7/32."
        ) from err
    return f"{address}/32"


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


def on_instances(config: ClusterConfig, run: Run) -> ClusterConfig:
    """The cluster file as the SSH backend uses it on the instances once they exist.

    Their host keys are new, and EC2 hands a terminated instance's public address to the next
    one, so the keys go into a known_hosts file of the run's own, recorded on first contact
    (accept-new); a key that changes within the run is still refused."""
    ssh = dataclasses.replace(
        config.ssh,
        provision=None,
        known_hosts=str(run.dir / "known_hosts"),
        host_key_policy="accept-new",
    )
    return config.with_section("ssh", ssh)


def provisioned_run(
    config: ClusterConfig,
    run: Run,
    start: Callable[[Plan], Any],
    say: Say,
    detach: bool = False,
    down_at_end: bool = False,
    plan: Plan | None = None,
) -> Any:
    """Show the cost, create the instances, run ``start(plan)`` on them, and terminate them
    when asked (``down_at_end``: ``up --down``, or ``terminate_at_end``), or whenever the cluster
    never started. ``plan``: the plan made on :func:`candidate_hosts` (made here when not
    given). A detached run (``detach``) keeps its
    instances once started: they terminate when 'down' or 'gc' says so, or by themselves when
    idle after the run ended."""
    section = config.ssh.provision
    provider = provider_for(config, say)
    candidates = provider.candidates(config)
    if plan is None:
        plan = make_plan(config, pending_hosts(candidates))
    planned = provider.instances_for(candidates, plan)
    if len(planned) < len(candidates):  # placement on fewer hosts may differ: plan on those
        plan = make_plan(config, pending_hosts(planned))
    lines = provider.cost_lines(planned)
    say("cost of the instances this run creates:\n" + cost_table(lines))
    prices = {line.instance_type: line.price for line in lines}
    ids: dict[str, str] = {}
    group = None
    started = False
    try:
        with _signals_interrupt():
            ports = [t.port for t in plan.tasks if t.port]
            group = provider.open_network(
                run.id, config.name, ports, config.ssh.port, section.ssh_from or my_public_cidr()
            )
            run.update_meta(**{provider.name: {**provider.access(), "security_group": group}})
            extra = {TAG_LAUNCHER: launcher_tag(), TAG_RUN_DIR: str(run.dir)}
            data = user_data(config.supervision.max_runtime, section.idle_timeout)
            say(f"creating {len(planned)} instance(s) in security group {group}")
            ids = provider.create(planned, run.id, config.name, group, extra, data)
            _record(run, planned, ids, prices)
            found = provider.wait_running(list(ids.values()), section.ready_timeout)
            hosts = provider.hosts(planned, ids, found, config.ssh.jump_host is not None)
            if config.ssh.jump_host is None:  # behind a jump host sshd is not reachable from here
                wait_for_ssh(hosts, config.ssh.port, section.ready_timeout, say)
            real = make_plan(config, hosts, run.dir)  # the run's own checkpoint directory
            run.write_plan(real)
        started = True
        return start(real)
    except KeyboardInterrupt as err:
        if started:
            raise
        raise Interrupted(
            f"interrupted ({err or 'SIGINT'}) while the instances were being made; those made "
            "so far are terminated below"
        ) from None
    finally:
        asked = section.terminate_at_end or down_at_end
        keep = started and (detach or not asked)
        if keep:
            say(
                f"the instances keep running: 'tflaunch down {run.id}' terminates them (they "
                f"terminate themselves after {section.idle_timeout:g} s idle)"
            )
        elif ids or group:
            say(f"terminating {len(ids)} instance(s)")
            provider.terminate(list(ids.values()), group)
            mark_terminated(run)


def _record(
    run: Run, planned: Sequence[PlannedInstance], ids: dict[str, str], prices: dict[str, Price]
) -> None:
    now = time.time()
    run.update_meta(
        instances=[
            {"id": ids[p.name], "name": p.name, "type": p.instance_type, "role": p.role,
             "spot": p.spot, "hourly_usd": prices[p.instance_type].hourly_usd,
             "launched": now, "terminated": None}
            for p in planned if p.name in ids
        ]
    )  # fmt: skip


def terminate_run(run: Run, say: Say) -> str:
    """``tflaunch down``: terminate the instances a run created; what was done, in words."""
    meta = run.read_meta()
    provider: Provider | None = provider_of_run(meta, say)
    if provider is None:
        return ""
    alive = provider.describe(tags={TAG_RUN: run.id})
    provider.terminate([i.id for i in alive], meta[provider.name].get("security_group"))
    mark_terminated(run)
    return f"terminated {len(alive)} instance(s) of run {run.id}"
