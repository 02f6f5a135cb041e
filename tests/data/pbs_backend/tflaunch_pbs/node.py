"""Inside a PBS job: ``pbsdsh`` starts this on every node; node 0 coordinates (the base's)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tflaunch.plugin import Host, JobNode, job_main, read_job


@dataclass(frozen=True)
class PbsNode(JobNode):
    vnode: int  # pbsdsh's PBS_VNODENUM: this node's place in the job's node file
    nodes: tuple[str, ...]

    backend: ClassVar[str] = "pbs"
    scheduler: ClassVar[str] = "PBS"

    @property
    def coordinates(self) -> bool:
        return self.vnode == 0

    @property
    def output_hint(self) -> str:
        return f"{self.run.dir}/pbs.out"

    def hosts(self, known_gpus) -> list[Host]:
        return [Host(n, n, n, known_gpus.get(n, ())) for n in self.nodes]


def load(run_dir: Path, env) -> PbsNode:
    config, run = read_job(run_dir)
    nodes = tuple(dict.fromkeys(Path(env["PBS_NODEFILE"]).read_text().split()))
    vnode = int(env.get("PBS_VNODENUM", "0"))
    return PbsNode(
        config=config,
        run=run,
        name=nodes[vnode],
        job_id=env.get("PBS_JOBID", "?"),
        gpu_ids=tuple(g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g),
        vnode=vnode,
        nodes=nodes,
    )


if __name__ == "__main__":
    sys.exit(job_main(load, prog="python -m tflaunch_pbs.node", doc=__doc__))
