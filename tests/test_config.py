"""The cluster file: what it accepts, and one clear error (exit 2, file:line, no traceback) per
kind of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import cpu_bounded
from tflaunch.cli import cli
from tflaunch.cluster.config import config_schema, load_config, parse_config
from tflaunch.errors import ConfigError
from tflaunch.launchers.slurm.section import SlurmSection
from tflaunch.launchers.ssh.section import SshSection

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
    assert [(h.name, h.gpus) for h in config.hosts] == [("a", None), ("b", 2)]
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
        "run_dir_mode",
        "slurm",
        "ssh",
        "kubernetes",
    }
    assert schema["properties"]["backend"]["enum"] == ["local", "slurm", "ssh"]
    result = CliRunner().invoke(cli, ["schema"])
    assert json.loads(result.output) == schema


def test_examples_validate():
    # As after the README's install: the venv's bin first on PATH (its python3 has tf_keras,
    # which validate asks of examples/keras-mwms.yaml's program.keras: legacy).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        if "sweep" in example.name:
            continue
        config = load_config(example)
        if config.backend == "local":
            result = CliRunner().invoke(cli, ["validate", str(example)], env={"PATH": path})
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


# --- Hostile and unlucky files (issue 15): each finding's smallest reproducer. -----------------


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="c.yaml")
    message = str(err.value)
    assert "\n" not in message
    return message


def _cli(tmp_path, raw: bytes | str, *args: str):
    path = tmp_path / "c.yaml"
    path.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    result = CliRunner().invoke(cli, [*(args or ("validate",)), str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _lol_bomb(levels: int, width: int = 9, at: str = "") -> str:
    lines = ['l0: &l0 ["lol"' + ', "lol"' * (width - 1) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\n{at}"


def test_alias_bomb_is_fast_and_refused():
    """The 541-byte billion laughs took 20 s and >4 GB: positions were recorded per path."""
    with cpu_bounded(2):
        message = _error(_lol_bomb(9))  # 8 x 9 aliases, 9^9 strings if expanded
    # l6 is the first list that would hold more than a million values written out.
    assert message.startswith(
        "c.yaml:7: aliases (*name) make this value expand to more than 1,000,000 values"
    )
    # Under keys the format knows, the walk stops at the first value of the wrong shape.
    nested = (
        "program: [p]\nslurm:\n  python: &a lol\n  options: &b [*a, *a, *a, *a, *a, *a]\n"
        "  setup: &c [*b, *b, *b, *b, *b, *b]\nssh:\n  upload: [*c, *c, *c, *c, *c, *c]\n"
    )
    with cpu_bounded(2):
        assert "c.yaml:5: slurm.setup[0]: expected a string, got a list" in _error(nested)
    too_many = _error(_lol_bomb(13))
    assert "more than 100 aliases" in too_many


def test_alias_bomb_inside_a_list_of_the_format_is_refused_by_the_reader():
    """Refused before validation looks at it, so no later walk of the data (a message that shows
    a value, plan.json) can meet the expansion."""
    levels = ['&l0 ["lol"' + ', "lol"' * 8 + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "program: [p]\nbackend: ssh\nhosts: [a]\nssh:\n  upload: [" + ", ".join(levels) + "]\n"
    with cpu_bounded(2):
        message = _error(text)
    assert message.startswith(
        "c.yaml:5: aliases (*name) make this value expand to more than 1,000,000 values"
    )


def _merge_bomb(levels: int = 20, **keys: str) -> str:
    """One flow mapping whose merge list doubles its keys per level: 2^levels keys counting each
    merge. PyYAML 6.0.3 builds them all; 6.0.4 keeps each key once, so the mapping ends with only
    ``levels`` keys and, in ``program.env``, would even be a valid file."""
    anchors = ["&m0 {K0: '1'}"]
    anchors += [f"&m{i} {{<<: [*m{i - 1}, *m{i - 1}], K{i}: '1'}}" for i in range(1, levels)]
    own = "".join(f", {key}: {value}" for key, value in keys.items())
    return "{<<: [" + ", ".join(anchors) + "]" + own + "}"


MERGE_BOMB_PLACES = {
    "program.env": "program:\n  argv: [p]\n  env: {bomb}\n",
    "a host entry": "program: [p]\nbackend: ssh\nhosts:\n  - a\n  - {bomb_named}\n",
    "slurm": "program: [p]\nbackend: slurm\nslurm: {bomb}\n",
    "supervision": "program: [p]\nsupervision: {bomb}\n",
}


@pytest.mark.parametrize("place", sorted(MERGE_BOMB_PLACES))
def test_merge_key_bomb_is_refused_wherever_a_mapping_is_valid(place):
    """tflaunch counts merged keys itself, before PyYAML flattens anything, so the same file gets
    the same error on every PyYAML release (6.0.4 changed how merges are flattened)."""
    template = MERGE_BOMB_PLACES[place]
    text = template.format(bomb=_merge_bomb(), bomb_named=_merge_bomb(name="b"))
    line = text[: text.index("{<<")].count("\n") + 1
    with cpu_bounded(2):
        message = _error(text)
    assert message.startswith(
        f"c.yaml:{line}: merge keys (<<) make this mapping hold more than 10,000 keys"
    ), message


def test_merge_key_bomb_is_refused():
    lines = ["m0: &m0 {k0: 1}"]
    for i in range(1, 25):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}")
    with cpu_bounded(2):
        message = _error("\n".join(lines))
    # m13 is the first to reach 2^14 - 1 keys counting each merge.
    assert message.startswith(
        "c.yaml:14: merge keys (<<) make this mapping hold more than 10,000 keys"
    )


def test_merges_up_to_the_bound_are_accepted():
    text = "program:\n  argv: [p]\n  env: " + _merge_bomb(levels=12) + "\n"  # 8,178 merged
    assert sorted(parse_config(text).program.env) == sorted(f"K{i}" for i in range(12))


@pytest.mark.parametrize(
    "text",
    [
        "program: &a [p, *a]\n",
        "program: [p]\nslurm: &s {options: [a], python: *s}\n",
        "program: [p]\nslurm: &s {<<: *s, python: p}\n",
    ],
)
def test_a_value_that_contains_itself_is_refused(text):
    assert "contains itself through an alias (*name)" in _error(text)


def test_nesting_through_aliases_is_bounded_like_written_nesting():
    """Each is 20 levels as written; the alias puts one inside the other, 36 levels down."""
    deep = "[" * 20 + "x" + "]" * 20
    text = f"program: [p]\nslurm:\n  setup: &a {deep}\n  options: {'[' * 14}*a{']' * 14}\n"
    assert "aliases (*name) nest this value more than 32 levels deep" in _error(text)


def test_deep_nesting_is_refused_not_a_recursion_error():
    message = _error("program: [p]\nname: " + "[" * 600 + "]" * 600 + "\n")
    assert message.startswith("c.yaml:2: nested more than 32 levels deep")


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    result = _cli(tmp_path, b"program: [p]\nname: caf\xe9\n")
    assert result.exit_code == 2
    assert "c.yaml:2: byte 0xe9 at column 10 is not UTF-8" in result.output


def test_control_character_names_file_and_line(tmp_path):
    result = _cli(tmp_path, "program: [p]\nname: a\x01b\n")
    assert result.exit_code == 2
    assert "c.yaml:2: the control character U+0001 at column 8" in result.output


def test_file_past_one_mib_is_refused(tmp_path):
    result = _cli(tmp_path, "program: [p]\n" + "#" * (1 << 20) + "\n")
    assert result.exit_code == 2 and "larger than 1024 KiB" in result.output


def test_long_numbers_are_refused_before_python_converts_them():
    """An int of 400 digits overflowed float(); one of 5,000 digits cannot be printed."""
    assert "c.yaml:2: a number of 401 characters" in _error(
        "program: [p]\nsupervision: {heartbeat: 1" + "0" * 400 + "}\n"
    )
    assert "a number of 5,000 characters" in _error(
        "program: [p]\nroles: {ps: " + "9" * 5000 + "}\n"
    )


def test_duplicate_keys_are_errors():
    message = _error("program: [p]\nroles: {ps: 1}\nroles: {ps: 2}\n")
    assert "c.yaml:3: the key 'roles' is given twice (first at line 2)" in message
    assert "c.yaml:2: the key 'ps'" in _error("program: [p]\nroles: {ps: 1, ps: 2}\n")


def test_merge_keys_still_work_and_may_be_overridden():
    text = "program: [p]\nhosts:\n  - &h {name: a, gpus: 2}\n  - {<<: *h, name: b}\n"
    assert [(h.name, h.gpus) for h in parse_config(text).hosts] == [("a", 2), ("b", 2)]


@pytest.mark.parametrize(
    ("value", "number"), [("1:00:00", 3600), ("30:00", 1800), ("0123", 83), ("1_000", 1000)]
)
def test_number_where_a_string_is_meant_says_quote_it(value, number):
    message = _error(f"program: [p]\nbackend: slurm\nslurm:\n  account: {value}\n")
    assert f"c.yaml:4: slurm.account: expected a string, but YAML 1.1 reads {value} as " in message
    assert f"the number {number}; quote it: '{value}'" in message
    assert "quote it: '1:00:00'" in _error("program: [p]\nslurm: {time: 1:00:00}\n")


def test_number_that_reads_back_as_written_is_a_string():
    config = parse_config("program: [p, --steps, 100, 0.5]\nslurm: {account: 1234}\n")
    assert config.program.argv == ("p", "--steps", "100", "0.5")
    assert config.section(SlurmSection).account == "1234"
    assert "quote it: '0x1F'" in _error("program: {argv: [p], env: {MASK: 0x1F}}\n")


@pytest.mark.parametrize(
    "time_value", ["90", "30:00", "01:00:00", "2-0", "2-12", "2-12:30", "1-00:00:00", "UNLIMITED"]
)
def test_slurm_time_formats_sbatch_accepts(time_value):
    assert (
        parse_config(f"program: [p]\nslurm: {{time: '{time_value}'}}\n").section(SlurmSection).time
        == time_value
    )


@pytest.mark.parametrize("time_value", ["1h", "1:2:3:4", "-5", "1-", "soon", "1.5"])
def test_other_slurm_times_are_errors(time_value):
    message = _error(f"program: [p]\nslurm:\n  time: '{time_value}'\n")
    assert "c.yaml:3: slurm.time: " in message and "is not a Slurm time" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hosts: [{name: a, gpus: 1000000000}]", "hosts[0].gpus: must be at most 256"),
        ("roles: {ps: 1000000}", "roles.ps: must be at most 65,536"),
        ("roles: {worker: 70000}", "roles.worker: must be at most 65,536"),
        ("roles: {ps: 65536, worker: 1}", "roles: 65537 tasks in all; at most 65,536"),
        ("slurm: {gpus_per_node: 10000000}", "slurm.gpus_per_node: must be at most 256"),
        ("slurm: {nodes: 100000}", "slurm.nodes: must be at most 4,096"),
        ("slurm: {cpus_per_task: 100000}", "slurm.cpus_per_task: must be at most 65,536"),
        ("placement: {workers_per_host: 100000}", "workers_per_host: must be at most 65,536"),
        ("placement: {ps_per_host: 100000}", "placement.ps_per_host: must be at most 65,536"),
        ("placement: {gpus_per_worker: 1000}", "gpus_per_worker: must be at most 256"),
        ("ssh: {gpus: 1000}", "ssh.gpus: must be at most 256"),
        ("ssh: {ec2: {gpus: 1000}}", "ssh.ec2.gpus: must be at most 256"),
        ("ports: {ps: 70000}", "ports.ps: must be at most 65,535"),
        ("ssh: {port: 70000}", "ssh.port: must be at most 65,535"),
        ("supervision: {ready_timeout: 1.0e+12}", "ready_timeout: must be at most 2,592,000"),
        ("supervision: {grace_period: .inf}", "grace_period: must be a finite number, got inf"),
        ("supervision: {finish_timeout: .nan}", "finish_timeout: must be a finite number"),
        ("supervision: {heartbeat: 15}", "heartbeat_timeout: 20 s is less than twice the"),
        ("supervision: {heartbeat: 5, heartbeat_timeout: 6}", "less than twice the heartbeat"),
        ("slurm: {options: [" + ", ".join(["x"] * 4097) + "]}", "has 4097 items; at most 4,096"),
        ("run_dir_mode: '0644'", "run_dir_mode: '0644' must give the owner"),
        ("run_dir_mode: 'rwx'", "run_dir_mode: 'rwx' is not an octal mode"),
    ],
)
def test_every_count_and_duration_is_bounded(text, expected):
    message = _error(f"program: [p]\n{text}\n")
    assert message.startswith("c.yaml:2: ") and expected in message


def test_bounds_are_in_the_json_schema():
    props = config_schema()["properties"]
    assert props["roles"]["properties"]["ps"]["maximum"] == 65536
    assert props["ssh"]["properties"]["port"]["maximum"] == 65535
    assert props["program"]["anyOf"][0]["properties"]["argv"]["maxItems"] == 4096


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('program: {argv: [p], env: {"X; touch /tmp/pwned #": 1}}', "'X; touch /tmp/pwned #' is"),
        ('program: {argv: [p], env: {"A=B": 1}}', "program.env.A=B: 'A=B' is not a valid"),
        ('program: {argv: [p], env: {"1X": 1}}', "'1X' is not a valid environment variable"),
        ('program: {argv: [p], env_from: ["--split-string=x"]}', "program.env_from[0]: "),
        ("program: {argv: [p], env_from: [A, A]}", "env_from[1]: 'A' is listed twice"),
        ("program: {argv: [p], env: {A: x}, env_from: [A]}", "also set in program.env"),
        ('program: [p, "a\\0b"]', "program.argv[1]: 'a\\x00b' holds a NUL character"),
        ('program: {argv: [p], env: {A: "a\\0b"}}', "program.env.A: 'a\\x00b' holds a NUL"),
        ('program: [p]\nslurm: {partition: "a\\nb"}', "slurm.partition: must fit on one line"),
        ('program: [p]\nslurm: {account: "a\\rb"}', "slurm.account: must fit on one line"),
        ('program: [p]\nslurm: {options: ["--x=a\\nb"]}', "slurm.options[0]: must fit on one"),
        ('program: [p]\nname: "a\\nb"', "name: must fit on one line"),
        ('program: [p]\nbackend: slurm\nruns_dir: "r\\nx"', "runs_dir: must fit on one line"),
    ],
)
def test_injection_is_refused_at_validation(text, expected):
    assert expected in _error(text + "\n")


def test_env_from_fits_the_backend():
    ssh = "program: {argv: [p], env_from: [TOKEN]}\nbackend: ssh\nhosts: [a]\n"
    assert "is not supported by backend ssh yet" in _error(ssh)
    slurm = "program: {argv: [p], env_from: [T]}\nbackend: slurm\nslurm: {options: [--export=NONE]}"
    assert "slurm.options[0]: '--export=NONE' would stop sbatch" in _error(slurm)
    ok = "program: {argv: [p], env_from: [T]}\nbackend: slurm\nslurm: {options: [--export=ALL]}"
    assert parse_config(ok).program.env_from == ("T",)


def test_env_from_must_be_set_at_up():
    from tflaunch.errors import LaunchError
    from tflaunch.launch import check_env_from

    config = parse_config("program: {argv: [p], env_from: [TOKEN, KEY]}\n", source="c.yaml")
    check_env_from(config, {"TOKEN": "t", "KEY": "k"})
    with pytest.raises(LaunchError, match="names KEY, which is not set in this environment"):
        check_env_from(config, {"TOKEN": "t"})
    slurm = parse_config("program: {argv: [p], env_from: [T]}\nbackend: slurm\n")
    with pytest.raises(LaunchError, match="SBATCH_EXPORT=NONE would keep sbatch"):
        check_env_from(slurm, {"T": "t", "SBATCH_EXPORT": "NONE"})


@pytest.mark.parametrize("arg", ["{job_name:d}", "{task_index!r}", "{port:>{port}}"])
def test_placeholder_format_specs_are_a_clear_error(tmp_path, arg):
    result = _cli(tmp_path, f"program: [p, '{arg}']\n")
    assert result.exit_code == 2, result.output
    assert "placeholders are replaced as they are, without format specs" in result.output


def test_render_env_prints_quoted_exports_only(tmp_path):
    result = _cli(
        tmp_path,
        'program: {argv: [p], env: {A: "x\'; touch pwned #"}}\n',
        "render",
        "--task",
        "worker:0",
        "--format",
        "env",
    )
    assert result.exit_code == 0, result.output
    assert "export A='x'\"'\"'; touch pwned #'\n" in result.output
    bad = _cli(tmp_path, 'program: {argv: [p], env: {"X; touch pwned #": 1}}\n', "render",
               "--task", "worker:0", "--format", "env")  # fmt: skip
    assert bad.exit_code == 2 and "export" not in bad.output


def test_aws_example_without_boto3_validates_and_plan_names_the_extra(monkeypatch):
    for name in ("boto3", "botocore", "botocore.exceptions"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    result = CliRunner().invoke(cli, ["validate", str(ROOT / "examples" / "aws.yaml")])
    assert result.exit_code == 0, result.output
    assert "aws.yaml: file ok; planning and running it need boto3 (pip install " in result.output
    result = CliRunner().invoke(cli, ["plan", str(ROOT / "examples" / "aws.yaml")])
    assert result.exit_code == 2, result.output
    assert "ssh.ec2 needs boto3, which is not installed: pip install 'tflaunch[aws]'" in (
        result.output
    )


def test_ssh_host_wait_needs_a_restart_policy() -> None:
    base = "program: [p]\nbackend: ssh\nhosts: [a]\nssh: {host_wait: 30}\n"
    with pytest.raises(ConfigError, match="ssh.host_wait: needs a restart policy"):
        parse_config(base)
    assert (
        parse_config(base + "supervision: {restart: {ps: exit-code}}\n")
        .section(SshSection)
        .host_wait
        == 30
    )


@pytest.mark.parametrize("name", ["-rf", "--help", ".hidden", "_x", "'-x'", "' x'", "''"])
def test_a_cluster_name_must_start_with_a_letter_or_digit(name):
    message = _error(f"program: [p]\nname: {name}\n")
    assert (
        message.startswith("c.yaml:2: name: ") and "must start with a letter or a digit" in message
    )


def test_run_ids_never_start_with_a_dash_or_dot():
    from tflaunch.runtime.run import new_run_id

    assert new_run_id("--x").startswith("x-") and new_run_id("..").startswith("run-")
    assert parse_config("program: [p]\nname: 9-lives\n", source="c.yaml").name == "9-lives"
