"""The inline backend's Backend: one agent subprocess per host of the plan, on this machine,
started with nothing but tflaunch's plugin surface."""

from __future__ import annotations

import os
import subprocess
import sys

from tflaunch.plugin import Backend, ProcessLink, agent_argv, hosts_from_config, spawn
from tflaunch_inline import InlineSection


class InlineBackend(Backend):
    name = "inline"

    def hosts(self, config):
        return hosts_from_config(config)

    def start_agents(self, config, plan, run):
        section = config.section(InlineSection)
        print(f"[inline] {section.greeting}", flush=True)
        env = {**os.environ, section.agents_env: section.greeting}
        links = []
        for host in plan.hosts_with_tasks():
            argv = agent_argv(sys.executable, str(run.plan_path), host.name, str(run.dir))
            proc = spawn(
                argv,
                env,
                cwd=None,
                stdin=subprocess.PIPE,
                stderr=None,
                die_with_parent=False,
                text=True,
            )
            links.append(ProcessLink(host.name, proc))
        return links
