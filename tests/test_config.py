"""The cluster file: what it accepts, and one clear error (exit 2, file:line, no traceback) per
kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tflaunch.cli import cli
from tflaunch.config import config_schema, load_config, parse_config
from tflaunch.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_minimal_file_gets_defaults():
    config = parse_config("program: [python3, train.py]\n")
    assert config.program.argv == ("python3", "train.py")
    assert (config.roles.ps, config.roles.worker, config.roles.chief) == (1, 2, 0)
    assert (config.ports.ps, config.ports.worker) == (2230, 2220)
    assert config.backend == "local" and config.placement.ps == "colocated"


def test_hosts_may_be_bare_names_and_env_values_become_strings():
    config = parse_config(
        "program: {argv: [p], env: {N: 4, FLAG: true}}\nhosts: [a, {name: b, gpus: 2}]\n"
    )
    assert [(h.name, h.gpus) for h in config.hosts] == [("a", 0), ("b", 2)]
    assert dict(config.program.env) == {"N": "4", "FLAG": "true"}


def test_workdir_is_relative_to_the_cluster_file(tmp_path):
    (tmp_path / "c.yaml").write_text("program: {argv: [p], workdir: sub}\n")
    assert load_config(tmp_path / "c.yaml").workdir == str(tmp_path / "sub")


BAD = {
    "yaml_syntax": (
        "program: [python3\nroles: {ps: 1}\n",
        ":2: the cluster file is not valid YAML",
    ),
    "unknown_key": (
        "program: [p]\nroles:\n  ps: 1\n  workers: 2\n",
        ":4: roles.workers: unknown key 'workers': did you mean 'worker'?",
    ),
    "wrong_type": (
        "program: [p]\nroles: {ps: two}\n",
        ":2: roles.ps: expected an integer, got the string 'two'",
    ),
    "bad_choice": (
        "program: [p]\nplacement:\n  ps: colocate\n",
        ":3: placement.ps: expected one of 'colocated', 'dedicated', got 'colocate' (did you mean 'colocated'?)",
    ),
    "missing_program": ("roles: {ps: 1}\n", ":1: program: is required"),
    "empty_argv": ("program: []\n", ":1: program.argv: is empty"),
    "negative": ("program: [p]\nroles: {worker: -1}\n", ":2: roles.worker: must be at least 0"),
    "evaluator_without_chief": (
        "program: [p]\nroles: {evaluator: 1}\n",
        ":2: roles.evaluator: an evaluator needs a chief",
    ),
    "too_few_hosts": (
        "program: [p]\nroles: {worker: 3}\nhosts: [a]\nplacement: {workers_per_host: 2}\n",
        "too few host slots: 3 worker tasks",
    ),
    "duplicate_host": (
        "program: [p]\nhosts: [a, b, a]\n",
        ":2: hosts[2].name: host 'a' is listed twice",
    ),
    "empty_file": ("", "the cluster file is empty"),
    "old_module_name": (
        "program: [python3, -m, models.mnist]\n",
        ":1: program.argv[2]: the module 'models.mnist' is now 'tflaunch.models.mnist'",
    ),
}


def test_a_projects_own_models_package_is_not_taken_for_ours(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mnist.py").write_text("")
    (tmp_path / "c.yaml").write_text("program: [python3, -m, models.mnist]\n")
    assert load_config(tmp_path / "c.yaml").program.argv[2] == "models.mnist"


def test_installed_package_adds_only_tflaunch_names(tmp_path):
    """A non-editable install into a fresh venv puts no top-level 'models' or 'launchers' into
    site-packages: ours are tflaunch.models and tflaunch.launchers."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True
    )
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    top = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))}
    assert "tflaunch" in top and not top & {"models", "launchers"}, sorted(top)
    assert (site / "tflaunch" / "models" / "mnist.py").is_file()
    assert (site / "tflaunch" / "models" / "nets" / "inception.py").is_file()
    assert (site / "tflaunch" / "launchers" / "slurm" / "node.py").is_file()
    probe = (
        "import tflaunch.models.placement_math\nfor name in ('models', 'launchers'):\n"
        "    try: __import__(name)\n    except ModuleNotFoundError as e: print(e)"
    )
    result = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site)},
    )
    assert result.stdout.split("\n")[:2] == [
        "No module named 'models'",
        "No module named 'launchers'",
    ], result.stderr


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exit_2_with_location(tmp_path, case):
    text, message = BAD[case]
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.startswith("tflaunch: error: ")
    if message.startswith(":"):
        assert f"{path}{message.split(':', 2)[0]}:{message.split(':', 2)[1]}" in result.output


def test_unreadable_file_is_bad_input(tmp_path):
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "cannot read the cluster file (No such file or directory)" in result.output


@pytest.mark.parametrize("case", ["yaml_syntax", "unknown_key", "too_few_hosts"])
def test_no_traceback_from_the_real_command(tmp_path, case):
    path = tmp_path / "cluster.yaml"
    path.write_text(BAD[case][0])
    result = subprocess.run(
        [sys.executable, "-m", "tflaunch", "up", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_debug_shows_the_traceback(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(BAD["unknown_key"][0])
    result = CliRunner().invoke(cli, ["--debug", "validate", str(path)])
    assert result.exit_code == 2


def test_schema_is_json_schema_of_the_same_format():
    schema = config_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {
        "program",
        "name",
        "backend",
        "roles",
        "hosts",
        "placement",
        "ports",
        "supervision",
        "runs_dir",
        "slurm",
        "ssh",
    }
    assert schema["properties"]["backend"]["enum"] == ["local", "slurm", "ssh"]
    result = CliRunner().invoke(cli, ["schema"])
    assert json.loads(result.output) == schema


def test_examples_validate():
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        if "sweep" in example.name:
            continue
        config = load_config(example)
        if config.backend == "local":
            result = CliRunner().invoke(cli, ["validate", str(example)])
            assert result.exit_code == 0, (example, result.output)


def test_cli_and_launchers_do_not_import_tensorflow():
    code = (
        "import sys; from click.testing import CliRunner; from tflaunch.cli import cli; "
        "import tflaunch.launchers.local, tflaunch.launchers.base; "
        f"r = CliRunner().invoke(cli, ['plan', {str(ROOT / 'examples' / 'local.yaml')!r}]); "
        "assert r.exit_code == 0, r.output; "
        "assert 'tensorflow' not in sys.modules; print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_version_and_help():
    runner = CliRunner()
    assert "tflaunch, version" in runner.invoke(cli, ["--version"]).output
    for command in ("up", "plan", "render", "validate", "schema", "status", "logs", "down"):
        result = runner.invoke(cli, [command, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output


def test_config_error_is_a_domain_error():
    with pytest.raises(ConfigError):
        parse_config("program: [p]\nbogus: 1\n")
