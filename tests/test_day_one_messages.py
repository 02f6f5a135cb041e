"""The smaller messages a new user meets on day one: each names the file and line, or the command
to use instead, in tflaunch's own words."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tflaunch.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_sweep_file_given_to_validate_points_to_bench():
    result = run("validate", str(ROOT / "examples" / "sweep.yaml"))
    assert result.exit_code == 2
    assert "sweep.yaml:6: cluster: this is a sweep file for 'tflaunch bench'" in result.output
    assert "unknown key" not in result.output


def test_a_tab_in_the_indentation_is_named(tmp_path):
    result = run("validate", write(tmp_path, "name: a\nprogram:\n\targv: [python3]\n"))
    assert result.exit_code == 2
    assert "c.yaml:3: a tab in the indentation: YAML indents with spaces only" in result.output
    assert "cannot start any token" not in result.output


def test_a_directory_as_the_cluster_file_is_tflaunchs_error(tmp_path):
    for args in (("validate",), ("plan",), ("up",), ("down", "--cluster", "x", "-f")):
        result = run(*args, str(tmp_path))
        assert result.exit_code == 2, (args, result.output)
        assert f"tflaunch: error: {tmp_path}: is a directory, not a cluster file" in result.output


def test_plan_errors_name_the_line(tmp_path):
    placeholder = write(tmp_path, "name: a\nprogram:\n  argv: [python3, x.py, '{nope}']\n")
    result = run("validate", "--offline", placeholder)
    assert result.exit_code == 2 and "c.yaml:3: program.argv item '{nope}'" in result.output
    ssh = write(tmp_path, "name: a\nbackend: ssh\nprogram: [python3]\n", "ssh.yaml")
    result = run("validate", "--offline", ssh)
    assert result.exit_code == 2 and "ssh.yaml:2: backend 'ssh' needs hosts" in result.output
    ports = write(
        tmp_path, "program: [p]\nroles: {ps: 0, worker: 3}\nports:\n  worker: 65534\n", "p.yaml"
    )
    result = run("validate", "--offline", ports)
    assert result.exit_code == 2 and "p.yaml:4: no free port for worker:2" in result.output


def test_model_and_tensorboard_options():
    model = " ".join(run("model", "--help").output.split())
    assert "--runs-dir, --run-dir" in model and "[default: inception3]" in model
    board = run("tensorboard", "--help").output
    assert "--runs-dir, --run-dir TEXT Where the run directories are." in " ".join(board.split())


def test_export_names_a_workdir_it_leaves_out(tmp_path):
    path = write(tmp_path, "name: a\nprogram:\n  argv: [python3, t.py]\n  workdir: .\n")
    result = run("export", path, "--format", "tfjob", "--image", "i")
    assert result.exit_code == 0
    assert "warning: program.workdir '.' (the cluster file's folder) is not in" in result.output
    quiet = write(tmp_path, "name: a\nprogram: [python3, t.py]\n", "q.yaml")
    assert "workdir" not in run("export", quiet, "--format", "tfjob", "--image", "i").output


def test_a_dry_run_says_its_run_directory_was_not_made(tmp_path):
    result = run(
        "up", "--dry-run", "--runs-dir", str(tmp_path), str(ROOT / "examples" / "daint.yaml")
    )
    assert result.exit_code == 0, result.output
    assert "#SBATCH" in result.output
    assert "tflaunch: dry run: nothing was started, and the run directory" in result.output
    assert list(tmp_path.iterdir()) == []
