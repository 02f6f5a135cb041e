"""Local backend: every task on this machine, one agent subprocess per host of the plan.

With the default hosts (just ``localhost``) that is one agent. A cluster file may list several
loopback hosts (127.0.0.2, ...) to rehearse a multi-node layout on one machine: each gets an
agent of its own, exactly as it would on separate nodes.

GPUs: a host whose ``gpus`` the file leaves out gets this machine's GPUs as ``nvidia-smi -L``
lists them, narrowed to an inherited ``CUDA_VISIBLE_DEVICES`` (whose ids, numbers or UUIDs, the
tasks then get), as torchrun and Ray find them; ``gpus: 0`` (or ``placement.gpus_per_worker: 0``)
keeps the tasks on CPU. Several local hosts share one machine's GPUs, so they are not found for
them: each such host needs its own ``gpus``. Found GPUs fewer than the host's workers leave
them on CPU, as a line at ``up`` says (see ``make_plan``). ``tflaunch plan`` says where each
count came from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections.abc import Mapping

from tflaunch.plugin import (
    Backend,
    ClusterConfig,
    Host,
    LaunchOptions,
    Outcome,
    Plan,
    ProcessLink,
    Run,
    free_ports,
    hosts_from_config,
    preflight_here,
    spawn_agent,
    unset_gpus,
)


class LocalBackend(Backend):
    name = "local"

    def launch(
        self, config: ClusterConfig, plan: Plan, run: Run, options: LaunchOptions | None = None
    ) -> Outcome:
        """As every backend; with ``up --terminals`` windows show the tasks."""
        kind = options.terminals if options else None
        if not kind:
            return super().launch(config, plan, run, options)
        from tflaunch.launchers.local.terminals import open_terminals

        with open_terminals(kind, plan, run):
            return super().launch(config, plan, run, options)

    def check_options(self, options: LaunchOptions) -> None:
        """Terminal windows can be opened here if the terminal program and a display are."""
        if options.terminals:
            from tflaunch.launchers.local.terminals import check

            check(options.terminals)

    def attach(self, run: Run) -> None:
        from tflaunch.launchers.local.terminals import attach

        attach(run)

    def hosts(self, config: ClusterConfig) -> list[Host]:
        hosts = hosts_from_config(config)
        open_hosts = [h for h in hosts if unset_gpus(config, h)]
        if not open_hosts:
            return hosts
        if len(hosts) > 1:
            why = f"none: {len(hosts)} local hosts share this machine's GPUs; give each its gpus"
            found: dict[str, Host] = {
                h.name: dataclasses.replace(h, gpu_source=why) for h in open_hosts
            }
        else:
            ids, source = detect_gpus(os.environ)
            found = {
                h.name: dataclasses.replace(h, gpu_ids=ids, gpu_source=source, gpus_found=bool(ids))
                for h in open_hosts
            }
        return [found.get(h.name, h) for h in hosts]

    def choose_ports(self, config: ClusterConfig, plan: Plan) -> Plan:
        """Free ports of this machine for the jobs whose base port the file leaves out, so that
        two runs at once (of one file, or of two on their defaults) do not collide; a port the
        file pins stays, and a busy one is refused at the start naming its holder."""
        tasks = [t for t in plan.tasks if t.port is not None and t.job not in config.ports_pinned]
        if not tasks:
            return plan
        return plan.with_ports(
            dict(zip((t.name for t in tasks), free_ports(len(tasks)), strict=True))
        )

    def check_here(self, config: ClusterConfig, plan: Plan) -> list[str]:
        """What each host's agent checks first (workdir, program on PATH, free ports, cores),
        and that every host's address resolves: all of it is this machine."""
        return preflight_here(plan, [h.name for h in plan.hosts_with_tasks()])

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list[ProcessLink]:
        return [spawn_agent(run, h.name, die_with_parent=False) for h in plan.hosts_with_tasks()]


NVIDIA_SMI_LINE = re.compile(r"GPU (\d+): .*?\(UUID: ([^)]+)\)")


def detect_gpus(environ: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """This machine's GPU ids for the tasks, and where they came from: ``nvidia-smi -L``'s
    indices, or the entries of an inherited ``CUDA_VISIBLE_DEVICES`` that name one of them (by
    index or UUID prefix, up to the first that does not, as CUDA reads the variable)."""
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
        )
    except FileNotFoundError:
        return (), "none found: no nvidia-smi on PATH"
    except (OSError, subprocess.SubprocessError) as err:
        return (), f"none found: nvidia-smi -L failed ({err})"
    if listed.returncode != 0:
        return (), f"none found: nvidia-smi -L exited with code {listed.returncode}"
    gpus = [m.groups() for m in map(NVIDIA_SMI_LINE.match, listed.stdout.splitlines()) if m]
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(index for index, _ in gpus), f"nvidia-smi -L ({len(gpus)} found)"
    chosen: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        known = any(entry == index or (entry and uuid.startswith(entry)) for index, uuid in gpus)
        if not known or entry in chosen:
            break
        chosen.append(entry)
    return tuple(chosen), (
        f"nvidia-smi -L ({len(gpus)} found), {len(chosen)} of them in the inherited "
        f"CUDA_VISIBLE_DEVICES={visible!r}"
    )
