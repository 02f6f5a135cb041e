"""Local backend: every task on this machine, one agent subprocess per host of the plan.

With the default hosts (just ``localhost``) that is one agent. A cluster file may list several
loopback hosts (127.0.0.2, ...) to rehearse a multi-node layout on one machine: each gets an
agent of its own, exactly as it would on separate nodes.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.plan import Host, Plan, hosts_from_config
from tflaunch.launchers.base import Backend, LaunchOptions
from tflaunch.runtime import procs
from tflaunch.runtime.link import ProcessLink, agent_argv
from tflaunch.runtime.run import Outcome, Run


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
        return hosts_from_config(config)

    def start_agents(self, config: ClusterConfig, plan: Plan, run: Run) -> list[ProcessLink]:
        links = []
        for host in plan.hosts_with_tasks():
            argv = agent_argv(sys.executable, str(run.plan_path), host.name, str(run.dir))
            # The agent outlives a killed launcher just long enough to see its input close and
            # tear its tasks down, so it is not tied to the launcher by the parent-death signal.
            proc = procs.spawn(
                argv,
                os.environ,
                cwd=None,
                stdin=subprocess.PIPE,
                stderr=None,
                die_with_parent=False,
                text=True,
            )
            links.append(ProcessLink(host.name, proc))
        return links
