"""The Slurm job: how many nodes it needs, and its sbatch script. Pure functions, golden-tested.

The script holds ``#SBATCH`` directives from the ``slurm:`` section, the user's ``setup`` lines,
and ONE ``srun`` step that starts one agent per node (``python -m tflaunch.launchers.slurm.node``); no
script per node. With ``placement.ps: dedicated`` it is a heterogeneous job: component 0 holds the
worker nodes with their GPUs, component 1 the CPU-only PS nodes, and the step spans both
(``srun --het-group=0,1``).

Quoting: the script speaks two languages, and each has exactly one quoting function here.
``#SBATCH`` lines are read by sbatch's own tokenizer (quotes group, a backslash escapes the next
character even inside quotes, an unquoted ``#`` starts a comment), so :func:`directive_word`
quotes for that; the shell body goes through :func:`shell_word` (``shlex.quote``). ``setup`` lines
are the one exception on purpose: they are shell the user writes (``module load ...``,
``source venv/bin/activate``) and are copied verbatim.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from tflaunch.launchers.slurm.section import SlurmSection
from tflaunch.plugin import BatchDetails, ClusterConfig, ConfigError, PlanError

NODE_MODULE = "tflaunch.launchers.slurm.node"
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")

# The job's files in its run directory: written by the login side (backend.py), read by the
# job's nodes (node.py); both take the names from here.
SCRIPT_FILE = "job.sbatch"
SETUP_FILE = "slurm.json"  # what the nodes need beside the cluster file (GPUs, output paths)


@dataclass(frozen=True)
class SlurmDetails(BatchDetails):
    """What a Slurm run adds to run.json (:class:`tflaunch.runtime.run.RunRecord`'s details):
    the batch base's fields (job id, cancel marker, nodes, ...) under Slurm's name."""


@dataclass(frozen=True)
class Layout:
    """The nodes a cluster needs: worker nodes (with GPUs) and dedicated PS nodes (without)."""

    worker_nodes: int
    ps_nodes: int  # dedicated PS nodes; 0 when the PS are co-located with workers
    gpus_per_node: int  # GPUs on each worker node, as requested from Slurm

    @property
    def nodes(self) -> int:
        return self.worker_nodes + self.ps_nodes

    @property
    def heterogeneous(self) -> bool:
        return self.ps_nodes > 0


def requested_gpus(config: ClusterConfig) -> int:
    """GPUs per worker node the job asks Slurm for (``gpus_per_node``, or the gpu count of ``gres``)."""
    slurm = config.section(SlurmSection)
    if slurm.gpus_per_node is not None:
        return slurm.gpus_per_node
    for item in (slurm.gres or "").split(","):
        fields = item.strip().split(":")
        if fields[0] == "gpu":
            # gpu, gpu:N or gpu:TYPE:N (Slurm's forms); a bare "gpu" is one.
            if len(fields) == 1:
                return 1
            if fields[-1].isdigit():
                return int(fields[-1])
            raise ConfigError(
                f"{config.source}: slurm.gres item {item!r} is not gpu:N or "
                "gpu:TYPE:N; write the GPU count last, e.g. gpu:2 or gpu:p100:1."
            )
    return 0


def layout(config: ClusterConfig) -> Layout:
    """The nodes the job needs, checked against ``slurm.nodes`` before anything is submitted."""
    roles, placement = config.roles, config.placement
    slots = roles.chief + roles.worker + roles.evaluator
    gpus = requested_gpus(config)
    per_node = _workers_per_node(config, gpus)
    dedicated = placement.ps == "dedicated" and roles.ps > 0
    ps_nodes = roles.ps if dedicated else 0
    needed = math.ceil(slots / per_node) if per_node else 1
    asked = config.section(SlurmSection).nodes
    if asked is None:
        return Layout(needed, ps_nodes, gpus)
    if dedicated and asked < needed + ps_nodes:
        raise PlanError(
            f"too few nodes: dedicated PS need a node each, so {roles.ps} PS + {needed} worker "
            f"node(s) ({slots} worker task(s) at {per_node} per node) need {needed + ps_nodes} "
            f"nodes, but slurm.nodes is {asked}. Raise slurm.nodes to {needed + ps_nodes}, lower "
            "roles.ps or roles.worker, or co-locate the PS (placement.ps: colocated)."
        )
    if not dedicated and per_node and asked * per_node < slots:
        raise PlanError(
            f"too few nodes: {slots} worker task(s) (workers, chief and evaluator) at {per_node} "
            f"per node need {needed} nodes, but slurm.nodes is {asked} ({asked * per_node} "
            f"slots). Raise slurm.nodes to {needed}, raise placement.workers_per_host, or lower "
            "roles.worker."
        )
    return Layout(asked - ps_nodes, ps_nodes, gpus)


def _workers_per_node(config: ClusterConfig, gpus: int) -> int | None:
    """Worker tasks one node takes; None when only ``slurm.nodes`` bounds them (spread evenly)."""
    placement = config.placement
    if placement.workers_per_host:
        return placement.workers_per_host
    if gpus and placement.gpus_per_worker != 0:
        return max(1, gpus // (placement.gpus_per_worker or 1))
    # CPU nodes, nothing said: one worker per node when Slurm picks the count, as the CSCS runs.
    return None if config.section(SlurmSection).nodes else 1


def directive_word(value: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line, read back by sbatch exactly as given."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ConfigError(
            f"the sbatch option value {value!r} contains a line break; "
            "Slurm options must fit on one line."
        )
    if _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def comment_text(value: str) -> str:
    """``value`` inside a ``#`` comment line: as it is, or, when it holds a control character
    (a newline would end the comment and run the rest), as a JSON string, whose escapes hold
    none."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return json.dumps(value)
    return value


def shell_word(value: str) -> str:
    """``value`` as one word of the script's shell body."""
    return shlex.quote(value)


def _slurm_path(path: str) -> str:
    """A literal path for --output/--error, whose ``%`` patterns Slurm would otherwise expand."""
    return path.replace("%", "%%")


@dataclass(frozen=True)
class ScriptInputs:
    """What the script needs besides the config: where the run lives and how it is called."""

    run_id: str
    run_dir: str  # absolute, on a file system every node and the login node share
    cluster_file: str  # shown in the header comment only


def render_sbatch(config: ClusterConfig, job: Layout, inputs: ScriptInputs) -> str:
    """The job script for ``config`` (pure: same inputs, same text)."""
    slurm = config.section(SlurmSection)
    lines = [
        "#!/bin/bash",
        f"# tflaunch run {comment_text(inputs.run_id)}, from {comment_text(inputs.cluster_file)}",
        "# Generated; edits are not read back. Resubmitting it starts the same run directory.",
    ]
    output = slurm.output or _slurm_path(inputs.run_dir) + "/slurm-%j.out"
    common = [f"--job-name={config.name}", f"--output={output}"]
    if slurm.error:
        common.append(f"--error={slurm.error}")
    if slurm.signal:
        common.append(f"--signal={slurm.signal}")  # to the step's agents, which pass it on
    if slurm.requeue:
        # The first node requeues the job after the signal; a requeued job appends its output to
        # the same file, which the login node goes on following.
        common += ["--requeue", "--open-mode=append"]
    if job.heterogeneous:
        lines += ["# component 0: worker nodes"]
        lines += _component(config, job.worker_nodes, job.gpus_per_node, common, ps=False)
        lines += ["#SBATCH hetjob", "# component 1: dedicated parameter-server nodes (no GPUs)"]
        lines += _component(config, job.ps_nodes, 0, [], ps=True)
    else:
        lines += _component(config, job.worker_nodes, job.gpus_per_node, common, ps=False)
    lines.append("")
    if slurm.setup:
        lines.append("# setup lines from the cluster file (slurm.setup), verbatim:")
        lines += list(slurm.setup)
        lines.append("")
    lines += [
        "# One step, one agent per node; the first node's agent coordinates the run.",
        " ".join(_srun_head(config, job)) + " \\",
        "    " + " ".join(shell_word(w) for w in _agent_argv(config, inputs)),
        "",
    ]
    return "\n".join(lines)


def _component(
    config: ClusterConfig, nodes: int, gpus: int, common: Sequence[str], ps: bool
) -> list[str]:
    slurm = config.section(SlurmSection)
    options = [*common, f"--nodes={nodes}", "--ntasks-per-node=1"]
    for name, value in (
        ("time", slurm.time),
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
    ):
        if value:
            options.append(f"--{name}={value}")
    constraint = slurm.ps_constraint if ps else slurm.constraint
    if constraint:
        options.append(f"--constraint={constraint}")
    if gpus and slurm.gpus_per_node is not None:
        options.append(f"--gpus-per-node={gpus}")
    elif gpus and slurm.gres:
        options.append(f"--gres={slurm.gres}")
    if slurm.cpus_per_task:
        options.append(f"--cpus-per-task={slurm.cpus_per_task}")
    if slurm.mem:
        options.append(f"--mem={slurm.mem}")
    options += slurm.options
    return [f"#SBATCH {directive_word(o)}" for o in options]


def _srun_head(config: ClusterConfig, job: Layout) -> list[str]:
    """srun options: one agent per node; any agent failing ends the whole step at once."""
    head = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    if job.heterogeneous:
        head.append("--het-group=0,1")
    else:
        head += ['--nodes="$SLURM_JOB_NUM_NODES"', '--ntasks="$SLURM_JOB_NUM_NODES"']
    if config.section(SlurmSection).cpus_per_task:
        # Slurm 22.05's srun no longer takes --cpus-per-task from the batch environment.
        head.append(f"--cpus-per-task={config.section(SlurmSection).cpus_per_task}")
    return head  # constants and numbers only: no user text, nothing to quote


def _agent_argv(config: ClusterConfig, inputs: ScriptInputs) -> list[str]:
    return [config.section(SlurmSection).python, "-m", NODE_MODULE, "--run-dir", inputs.run_dir]
