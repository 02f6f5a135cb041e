"""sbatch script rendering (golden files) and the node-count check, without a Slurm cluster.

Regenerate the golden files after an intended change with ``UPDATE_GOLDEN=1 pytest
tests/test_slurm_script.py`` and review the diff.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.golden import assert_golden
from tests.helpers import mnist_argv, tflaunch
from tflaunch.cluster.config import parse_config
from tflaunch.errors import ConfigError, PlanError
from tflaunch.launchers.slurm.script import (
    Layout,
    ScriptInputs,
    directive_word,
    layout,
    render_sbatch,
    requested_gpus,
)

GOLDEN = Path(__file__).parent / "golden" / "slurm"
NASTY = "a'; echo foo"

MNIST = mnist_argv("python3")


def config(**sections):
    data = {"name": "mnist", "backend": "slurm", "program": MNIST}
    data.update(sections)
    return parse_config(yaml.safe_dump(data), source="cluster.yaml", base_dir="/home/user/tf")


def inputs(run_dir: str = "/scratch/user/runs/mnist-1") -> ScriptInputs:
    return ScriptInputs(
        run_id="mnist-1", run_dir=run_dir, cluster_file="/home/user/tf/cluster.yaml"
    )


CASES = {
    "daint": config(
        name="inception-daint",
        roles={"ps": 2, "worker": 8},
        slurm={
            "nodes": 8,
            "time": "01:00:00",
            "partition": "normal",
            "account": "g34",
            "constraint": "gpu",
            "gpus_per_node": 1,
            "cpus_per_task": 12,
            "mem": "60G",
            "options": ["--exclusive", "--mail-type=END"],
            "setup": [
                "module load daint-gpu",
                "module load TensorFlow/1.2.1-CrayGNU-17.08-cuda-8.0-python3",
                'source "$HOME/venv/bin/activate"',
            ],
            "python": "python3",
        },
    ),
    "minimal": config(roles={"ps": 1, "worker": 3}),
    "heterogeneous": config(
        roles={"ps": 2, "worker": 3},
        placement={"ps": "dedicated"},
        slurm={
            "gres": "gpu:p100:2",
            "constraint": "gpu",
            "ps_constraint": "mc",
            "time": "10",
            "mem": "8G",
        },
    ),
    "nasty": config(
        name=NASTY,
        slurm={
            "nodes": 2,
            "account": 'x"y $HOME `id` #not-a-comment',
            "partition": "back\\slash",
            "options": [f"--comment={NASTY} # still the comment"],
            "error": "/tmp/err %j.txt",
            "python": "/opt/my env/bin/python3",
            "setup": ["export A='b c'  # verbatim"],
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case) -> None:
    run_dir = f"/scratch/{NASTY}/runs 100%/mnist-1" if case == "nasty" else inputs().run_dir
    text = render_sbatch(CASES[case], layout(CASES[case]), inputs(run_dir))
    assert_golden(GOLDEN / f"{case}.sbatch", text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_is_valid_bash(case, tmp_path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(CASES[case], layout(CASES[case]), inputs()))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr


def test_one_srun_step_starting_one_agent_per_node() -> None:
    text = render_sbatch(CASES["daint"], layout(CASES["daint"]), inputs())
    assert text.count("srun ") == 1
    assert "--kill-on-bad-exit=1" in text and "--ntasks-per-node=1" in text
    assert '--nodes="$SLURM_JOB_NUM_NODES"' in text
    assert "#SBATCH --nodes=8" in text and "#SBATCH --gpus-per-node=1" in text
    # setup lines come after every directive (sbatch stops reading them at the first command)
    assert text.index("module load daint-gpu") > text.rindex("#SBATCH")


def test_nasty_values_stay_single_words_in_the_shell_body() -> None:
    run_dir = f"/scratch/{NASTY}/runs"
    cfg = CASES["nasty"]
    text = render_sbatch(cfg, layout(cfg), inputs(run_dir))
    step = text.split("\n# One step")[1].split("\n", 1)[1].replace("\\\n", "")
    words = shlex.split(step)
    assert words[-5:] == [
        "/opt/my env/bin/python3",
        "-m",
        "tflaunch.launchers.slurm.node",
        "--run-dir",
        run_dir,
    ]


def _sbatch_words(line: str) -> list[str]:
    """Read an #SBATCH line the way sbatch's tokenizer does (quotes, backslash, # comments)."""
    words, word, quote, escape, started = [], [], "", False, False
    for ch in line:
        if escape:
            word.append(ch)
            escape = False
        elif ch == "\\":
            escape = started = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "'\"":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
    if started:
        words.append("".join(word))
    return words


@pytest.mark.parametrize(
    "value",
    [
        NASTY,
        'x"y $HOME `id` #c',
        "back\\slash",
        "tab\there",
        "plain",
        "--comment=a b",
        "#leading",
        "trailing\\",
    ],
)
def test_directive_word_reads_back_as_one_word(value) -> None:
    assert _sbatch_words(directive_word(value)) == [value]


def test_directive_word_refuses_line_breaks() -> None:
    with pytest.raises(ConfigError, match="line break"):
        directive_word("a\nb")


# --- node counts ---------------------------------------------------------------------------------


def test_default_nodes_one_worker_per_cpu_node() -> None:
    assert layout(config(roles={"ps": 1, "worker": 3})) == Layout(3, 0, 0)


def test_default_nodes_fill_the_gpus() -> None:
    cfg = config(roles={"ps": 2, "worker": 8}, slurm={"gpus_per_node": 4})
    assert layout(cfg) == Layout(2, 0, 4)


def test_dedicated_ps_add_nodes() -> None:
    cfg = config(roles={"ps": 2, "worker": 3}, placement={"ps": "dedicated"})
    job = layout(cfg)
    assert (job.worker_nodes, job.ps_nodes, job.nodes, job.heterogeneous) == (3, 2, 5, True)


def test_too_few_nodes_colocated_gives_the_counts() -> None:
    cfg = config(
        roles={"ps": 1, "worker": 5}, placement={"workers_per_host": 2}, slurm={"nodes": 2}
    )
    with pytest.raises(PlanError) as err:
        layout(cfg)
    message = str(err.value)
    assert "5 worker task(s)" in message and "2 per node need 3 nodes" in message
    assert "slurm.nodes is 2 (4 slots)" in message and "Raise slurm.nodes to 3" in message


def test_too_few_nodes_dedicated_gives_the_counts() -> None:
    cfg = config(
        roles={"ps": 2, "worker": 3},
        placement={"ps": "dedicated", "workers_per_host": 1},
        slurm={"nodes": 4},
    )
    with pytest.raises(PlanError) as err:
        layout(cfg)
    assert "2 PS + 3 worker node(s)" in str(err.value) and "need 5 nodes" in str(err.value)
    assert "slurm.nodes is 4" in str(err.value)


def test_gpu_limit_bounds_workers_per_node() -> None:
    cfg = config(roles={"ps": 1, "worker": 5}, slurm={"nodes": 2, "gpus_per_node": 2})
    with pytest.raises(PlanError, match="5 worker task"):
        layout(cfg)


def test_enough_nodes_pass() -> None:
    cfg = config(roles={"ps": 2, "worker": 3}, placement={"ps": "dedicated"}, slurm={"nodes": 6})
    assert layout(cfg) == Layout(4, 2, 0)


@pytest.mark.parametrize(
    "gres, count",
    [("gpu:2", 2), ("gpu:p100:1", 1), ("gpu", 1), ("craynetwork:4,gpu:3", 3), ("craynetwork:4", 0)],
)
def test_gpu_count_from_gres(gres, count) -> None:
    assert requested_gpus(config(slurm={"gres": gres})) == count


def test_bad_gres_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="gpu:TYPE:N"):
        requested_gpus(config(slurm={"gres": "gpu:p100"}))


# --- the command line, before anything reaches Slurm -------------------------------------------


def _write(tmp_path: Path, **sections) -> Path:
    data = {
        "name": "mnist",
        "backend": "slurm",
        "program": MNIST,
        "runs_dir": str(tmp_path / "runs"),
    }
    data.update(sections)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path) -> None:
    path = _write(tmp_path, roles={"ps": 1, "worker": 3}, slurm={"time": "00:10:00"})
    result = tflaunch("up", "--dry-run", str(path), env={"PATH": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=3" in result.stdout and "#SBATCH --time=00:10:00" in result.stdout
    assert not (tmp_path / "runs").exists()  # no run directory, and no sbatch on PATH to call


def test_too_few_nodes_is_exit_2_with_the_counts_before_submission(tmp_path) -> None:
    path = _write(
        tmp_path,
        roles={"ps": 1, "worker": 4},
        placement={"workers_per_host": 1},
        slurm={"nodes": 3},
    )
    result = tflaunch("up", str(path), env={"PATH": "/nonexistent"})
    assert result.returncode == 2
    assert (
        "too few nodes: 4 worker task(s)" in result.stderr and "slurm.nodes is 3" in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_plan_shows_placeholder_nodes(tmp_path) -> None:
    path = _write(tmp_path, roles={"ps": 2, "worker": 3}, placement={"ps": "dedicated"})
    result = tflaunch("plan", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("ps:1") and "slurm-node5" in line for line in lines)
    assert any(line.startswith("worker:0") and "slurm-node1" in line for line in lines)


def test_daint_example_renders_the_cscs_job(tmp_path) -> None:
    root = Path(__file__).resolve().parent.parent
    result = tflaunch(
        "up",
        "--dry-run",
        "--run-dir",
        str(tmp_path / "runs"),
        str(root / "examples" / "daint.yaml"),
    )
    assert result.returncode == 0, result.stderr
    for line in (
        "#SBATCH --nodes=8",
        "#SBATCH --constraint=gpu",
        "#SBATCH --gres=gpu:1",
        "module load daint-gpu",
    ):
        assert line in result.stdout.splitlines()
    plan = tflaunch("plan", str(root / "examples" / "daint.yaml"))
    assert "--data_format NCHW" in plan.stdout and "--batch_size 64" in plan.stdout
    assert sum(line.startswith("worker:") for line in plan.stdout.splitlines()) == 8
    assert sum(line.startswith("ps:") for line in plan.stdout.splitlines()) == 2


def test_hosts_section_is_refused_for_slurm(tmp_path) -> None:
    path = _write(tmp_path, hosts=["nid00001", "nid00002"])
    result = tflaunch("validate", str(path))
    assert result.returncode == 2
    assert "takes its nodes from the allocation" in result.stderr


def test_signal_ahead_of_the_time_limit_is_a_directive_of_the_job() -> None:
    cfg = config(slurm={"time": "00:10:00", "signal": "USR1@90"})
    assert "#SBATCH --signal=USR1@90" in render_sbatch(cfg, layout(cfg), inputs()).splitlines()


def test_signal_other_than_usr1_or_usr2_is_bad_input() -> None:
    with pytest.raises(ConfigError, match="slurm.signal: 'TERM@60' is not USR1@SECONDS"):
        config(slurm={"signal": "TERM@60"})


def test_newline_in_the_cluster_file_path_stays_inside_the_comment():
    """A path such as 'a\\ntouch pwned' once ended the header comment: the next line ran, and
    Slurm, finding a command before them, read no #SBATCH line at all."""
    inputs = ScriptInputs("r-1", "/runs/r-1", "/home/u/a\ntouch /tmp/pwned\n#.yaml")
    text = render_sbatch(config(), layout(config()), inputs)
    lines = text.splitlines()
    assert lines[1] == '# tflaunch run r-1, from "/home/u/a\\ntouch /tmp/pwned\\n#.yaml"'
    assert all(line.startswith("#") for line in lines[:6])
    assert not any(line.startswith("touch") for line in lines)


def test_requeue_makes_the_job_requeueable_with_its_output_appended() -> None:
    cfg = config(slurm={"time": "00:10:00", "signal": "USR1@120", "requeue": 2})
    lines = render_sbatch(cfg, layout(cfg), inputs()).splitlines()
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append" in lines
    plain = config(slurm={"time": "00:10:00", "signal": "USR1@120"})
    assert "--requeue" not in render_sbatch(plain, layout(plain), inputs())


def test_requeue_needs_the_warning_signal() -> None:
    with pytest.raises(ConfigError, match="slurm.requeue: needs slurm.signal"):
        config(slurm={"requeue": 1})


def test_checkpoint_wait_must_fit_before_the_time_limit() -> None:
    with pytest.raises(
        ConfigError,
        match=r"slurm.checkpoint_wait: 30 s, plus 10 s to stop the tasks .* does not fit in "
        r"the 40 s between the signal and the time limit",
    ):
        config(slurm={"signal": "USR1@40", "requeue": 1})
    config(slurm={"signal": "USR1@40", "requeue": 1, "checkpoint_wait": 20})
