"""Starting a cluster from code: what `tflaunch up` does, for callers such as `tflaunch bench`."""

from __future__ import annotations

import time
from pathlib import Path

from tflaunch.config import ClusterConfig
from tflaunch.coordinator import Outcome
from tflaunch.plan import Plan, make_plan
from tflaunch.run import Run


def prepare(
    config: ClusterConfig,
    run_root: str | None = None,
    run_id: str | None = None,
    cluster_file: str | None = None,
) -> tuple[Plan, Run]:
    """Plan the cluster on its backend's hosts and create its run directory."""
    from tflaunch.launchers import get_backend

    plan = make_plan(config, get_backend(config.backend).hosts(config))
    run = Run.create(run_root or config.run_dir, config.name, run_id)
    run.write_plan(plan)
    run.update_meta(
        run_id=run.id,
        name=config.name,
        backend=config.backend,
        state="created",
        cluster_file=str(Path(cluster_file).resolve()) if cluster_file else None,
        created=time.time(),
    )
    return plan, run


def run_cluster(config: ClusterConfig, run_root: str | None = None) -> tuple[Run, Outcome]:
    """Run the cluster to its end in the foreground (output streams to stdout)."""
    from tflaunch.launchers import get_backend

    plan, run = prepare(config, run_root)
    return run, get_backend(config.backend).launch(config, plan, run)
