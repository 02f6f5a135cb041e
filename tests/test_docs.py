"""The README and docs/ name only what exists: paths, modules, commands, cluster-file keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from docs_check import ROOT, _commands, check_pages, check_text, pages

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
    )
    assert check_text(text, ROOT / "README.md") == []


def test_a_page_in_docs_places_links_from_its_folder(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("")
    page = tmp_path / "docs" / "a.md"
    assert check_text("[b](b.md)", page, tmp_path) == []
    assert check_text("[b](docs/b.md)", page, tmp_path)
