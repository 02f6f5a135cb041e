"""The README and docs/ name only what exists: paths, modules, commands and their options,
benchmark and program flags, cited tests, cluster-file keys, copies of example files, the module
tree; and every exit code they promise is one a test asserts. Broken pages prove each check
notices."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from docs_check import ROOT, _commands, check_pages, check_text, pages, tree_problems

from tflaunch.cli import cli


def test_readme_and_docs_name_only_what_exists():
    problems = check_pages(pages())
    assert not problems, "\n".join(map(str, problems))


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in pages()[1:]:
        assert f"](docs/{page.name})" in readme, page.name


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_command_has_help(command):
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize(
    "text, expected",
    [
        ("see `launchers/slurm_script.py`", "missing path: launchers/slurm_script.py"),
        ("read [the page](docs/nowhere.md)", "link to a missing file: docs/nowhere.md"),
        ("`tflaunch.launchers.ssh.nothere`", "tflaunch.launchers.ssh has no 'nothere'"),
        ("`tflaunch.cluster.plan.no_such_function`", "has no 'no_such_function'"),
        ("```sh\ntflaunch frobnicate x.yaml\n```", "no command 'tflaunch frobnicate'"),
        ("set `supervision.no_such_key`", "no cluster-file key 'supervision.no_such_key'"),
        ("```yaml\nroles: {ps: 1}\nsupervision: {bogus: 1}\n```", "'supervision.bogus'"),
        # options, flags, cited tests, copies, exit codes
        (
            "```sh\ntflaunch up x.yaml --no-such-option\n```",
            "'tflaunch up' has no option --no-such",
        ),
        ("`tflaunch validate --offline --nope x.yaml`", "'tflaunch validate' has no option --nope"),
        ("see `status RUN --wach`", "'tflaunch status' has no option --wach"),
        ("`benchmarks/trace_cost.py --repeat 5`", "benchmarks/trace_cost.py has no flag --repeat"),
        ("`python -m tflaunch.models.mnist --num_step 3`", "models.mnist has no flag --num_step"),
        ("`tests/test_docs.py::test_nothing_here`", "tests/test_docs.py has no test 'test_nothing"),
        ("as `test_no_such_test_anywhere` shows", "no test 'test_no_such_test_anywhere' under"),
        ("```yaml\n# examples/local.yaml\nname: other\n```", "the copy of examples/local.yaml"),
        ("```yaml\n# examples/nowhere.yaml\nname: x\n```", "a copy of a missing file"),
        ("bad input exits 77, always", "exit code 77 is promised, but no test asserts it"),
        ("Ctrl-C: exit 130, 143 or 199", "exit code 199 is promised"),
        ("(177 for a SIGKILLed task)", "exit code 177 is promised"),
    ],
)
def test_the_check_notices_what_is_broken(text, expected):
    problems = check_text(text, ROOT / "README.md")
    assert any(expected in str(p) for p in problems), problems


def test_the_check_accepts_what_exists():
    text = (
        "`launchers/slurm/script.py`, [arch](docs/architecture.md), `tflaunch.cluster.plan`,"
        " `tflaunch.launchers.ssh.connect.remote_command`, `supervision.restart`,"
        " `slurm.time`, `program.env`, `hosts`\n```sh\ntflaunch up examples/local.yaml\n```\n"
        "```yaml\nroles: {ps: 1, worker: 2}\nhosts:\n  - {name: a, address: 10.0.0.1}\n```\n"
        "`up --detach`, `tflaunch validate --offline x.yaml`, `status RUN --watch`,"
        " `benchmarks/trace_cost.py --repeats 5`, `python -m tflaunch.models.mnist --train_steps 3`,"
        " `tests/test_docs.py::test_the_check_accepts_what_exists`, `test_readme_is_short`;"
        " bad input exits 2; Ctrl-C exits 130, 143 or 129\n"
        "```yaml\n# examples/local.yaml\n"
        + (ROOT / "examples" / "local.yaml").read_text()
        + "```\n"
    )
    assert check_text(text, ROOT / "README.md") == []


def architecture_tree() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("```\ntflaunch/")
    return text[start : text.index("```\n", start + 4) + 4]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            ("    diagnose.py statusline.py ", "    statusline.py "),
            "leaves out tflaunch/runtime/diagnose.py",
        ),
        (("  plugin.py ", "  plugins.py "), "the tree names tflaunch/plugins.py, which does not"),
        (("  plugin.py ", "  xx.py "), "the tree leaves out tflaunch/plugin.py"),
        (("  cluster/ ", "  clusters/ "), "the tree names tflaunch/clusters/"),
        (("    ec2/ lab/ ", "    gce/ lab/ "), "names launchers/clouds/gce/, which does not"),
        (
            ("tensorboard_serve.py, TensorBoard", "TensorBoard"),
            "leaves out launchers/tensorboard_serve.py",
        ),
        (("(data/)", "(the data)"), "the tree leaves out models/data/"),
    ],
)
def test_the_architecture_tree_is_the_folders(change, expected):
    tree = architecture_tree()
    assert tree_problems(tree.strip("`\n")) == []
    old, new = change
    assert old in tree
    problems = check_text(tree.replace(old, new), ROOT / "docs" / "architecture.md")
    assert any(expected in str(p) for p in problems), problems


def test_a_new_module_not_in_the_tree_fails(tmp_path: Path):
    """A copy of the core with one module more: the real tree leaves it out."""
    import shutil

    for name in ("tflaunch", "launchers", "models"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tflaunch" / "runtime" / "brand_new.py").write_text("")
    problems = tree_problems(architecture_tree().strip("`\n"), tmp_path)
    assert problems == ["the tree leaves out tflaunch/runtime/brand_new.py"]


def test_a_page_in_docs_places_links_from_its_folder(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("")
    page = tmp_path / "docs" / "a.md"
    assert check_text("[b](b.md)", page, tmp_path) == []
    assert check_text("[b](docs/b.md)", page, tmp_path)
