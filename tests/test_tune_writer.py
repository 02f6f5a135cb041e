"""``tune`` writes its tuned cluster file as run files are written (issue 39): never through a
symlink, whole or not at all, an existing file it did not write replaced only with --force,
the cluster file's name escaped in the header comment, and the configuration ``--apply`` starts
is the one it validated from what it wrote. No TensorFlow: the writer is the subject."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers import ROOT, write_cluster
from tflaunch.cli import cli
from tflaunch.errors import ConfigError
from tflaunch.runtime.run import Run
from tflaunch.tools.tune_file import ClusterFile, write_tuned
from tflaunch.tools.tune_settings import Ranked, Setting

BENCH = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "resnet50"]
WINNER = Ranked(Setting(0, "collective_all_reduce", "-", "none", "-"), 12.5, 0, "ring")


def _cluster(tmp_path: Path, name: str = "c.yaml") -> ClusterFile:
    path = write_cluster(
        tmp_path / name, {"argv": BENCH, "workdir": str(ROOT)}, roles={"ps": 1, "worker": 2}
    )
    return ClusterFile.read(path)


def _write(tmp_path: Path, file: ClusterFile, force: bool = False):
    run = Run.create(str(tmp_path / "runs"), "c-tune", None, 0o755)
    return write_tuned(file, WINNER, BENCH, run.id, run.dir, None, force)


def test_a_symlink_at_the_tuned_path_is_refused_and_never_written_through(tmp_path):
    file = _cluster(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs\n")
    planted = tmp_path / "c.tuned.yaml"
    planted.symlink_to(outside)
    with pytest.raises(ConfigError, match="is a symlink .*does not write through one"):
        _write(tmp_path, file)
    assert outside.read_text() == "theirs\n" and planted.is_symlink()
    path, _ = _write(tmp_path, file, force=True)  # the link replaced, not its target
    assert path == planted and not planted.is_symlink() and outside.read_text() == "theirs\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_existing_file_tune_did_not_write_is_replaced_only_with_force(tmp_path):
    file = _cluster(tmp_path)
    mine = tmp_path / "c.tuned.yaml"
    mine.write_text("name: my own tuning\n")
    with pytest.raises(ConfigError, match="was not written by tflaunch; give --force"):
        _write(tmp_path, file)
    assert mine.read_text() == "name: my own tuning\n"
    _write(tmp_path, file, force=True)
    assert mine.read_text().startswith("# tflaunch tune c.yaml (run c-tune-")
    _write(tmp_path, file)  # tune's own file: replaced without asking
    mine.write_text("name: mine again\n")
    early = CliRunner().invoke(cli, ["tune", str(file.path), "--runs-dir", str(tmp_path / "r2")])
    assert early.exit_code == 2 and "was not written by tflaunch" in early.output
    assert not (tmp_path / "r2").exists()  # refused before anything was measured


def test_a_cluster_file_name_with_line_breaks_stays_in_the_comment(tmp_path):
    file = _cluster(tmp_path, "c\nroles: {ps: 9}\u2028x\x85.yaml")
    path, config = _write(tmp_path, file)
    text = path.read_text()
    header, body = text.split("\n", 1)
    assert header.startswith("# tflaunch tune c\\nroles: {ps: 9}\\u2028x\\x85.yaml (run ")
    assert yaml.safe_load(text) == yaml.safe_load(body)
    assert config.roles.ps == 0 and yaml.safe_load(text)["roles"]["ps"] == 0


def test_the_configuration_returned_is_the_one_written_and_validated(tmp_path):
    file = _cluster(tmp_path)
    path, config = _write(tmp_path, file)
    path.write_text("name: swapped after the write\nroles: {worker: 7}\n")
    assert (config.roles.ps, config.roles.worker) == (
        0,
        2,
    ) and config.name != "swapped after the write"
