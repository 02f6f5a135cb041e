"""run.json is read and written in one place: :class:`tflaunch.runtime.run.Run` (the typed
:class:`RunRecord`, and the backends' parts of it). A scan of the shipped package finds any other
module that reads the file raw; the writers refuse fields no record or part declares."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.helpers import python_files
from tflaunch.launchers.clouds.base import CloudDetails, access_part
from tflaunch.launchers.slurm.script import SlurmDetails
from tflaunch.launchers.ssh.details import SshDetails
from tflaunch.runtime.run import Run, RunRecord

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ("tflaunch", "launchers", "models")  # what is installed; tests and benchmarks look in
RUN_FILE = ROOT / "tflaunch" / "runtime" / "run.py"
RUNFILES = ROOT / "tflaunch" / "runtime" / "runfiles.py"  # names the file, for run.py


def raw_reads(paths: list[Path]) -> list[str]:
    """``file:line: what`` for every way around :meth:`Run.record` in ``paths``: the raw reader
    (``read_meta``/``_read_meta``), the file's path (``meta_path`` other than in a message), its
    name (``META_FILE``, or the string ``"run.json"``)."""
    found = []
    for path in paths:
        if path.resolve() in (RUN_FILE, RUNFILES):
            continue
        tree = ast.parse(path.read_text(), str(path))
        in_messages = {
            id(value.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.JoinedStr)
            for value in node.values
            if isinstance(value, ast.FormattedValue)
        }
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr in ("read_meta", "_read_meta"):
                found.append(f"{where}: {node.attr}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "meta_path"
                and id(node) not in in_messages
                and not (isinstance(node.value, ast.Name) and node.value.id == "sys")
            ):
                found.append(f"{where}: meta_path")
            elif isinstance(node, ast.Name | ast.alias) and "META_FILE" in (
                getattr(node, "id", None),
                getattr(node, "name", None),
            ):
                found.append(f"{where}: META_FILE")
            elif isinstance(node, ast.Constant) and node.value == "run.json":
                found.append(f"{where}: the string 'run.json'")
    return found


def package_files() -> list[Path]:
    return python_files(*PACKAGE)


def test_only_run_py_reads_run_json():
    found = raw_reads(package_files())
    assert found == [], "read run.json through Run.record() (and .part()):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        'meta = run.read_meta()\nkeep = meta.get("keep_cluster")',
        "meta = run._read_meta()",
        "meta = json.loads(run.meta_path.read_text())",
        "from tflaunch.runtime.runfiles import META_FILE",
        'exists = (run_dir / "run.json").exists()',
    ],
)
def test_the_scan_finds_a_raw_read_added_to_a_copy_of_a_module(tmp_path, code):
    original = ROOT / "launchers" / "clouds" / "sweep.py"
    copy = tmp_path / "sweep.py"
    copy.write_text(original.read_text() + "\n\n" + code + "\n")
    assert raw_reads([copy])
    assert raw_reads([original]) == []


def test_the_scan_leaves_messages_and_docstrings_alone(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads run.json through Run.record()."""\n\n'
        'def f(run):\n    return f"no job id in {run.meta_path}; see run.json"\n'
    )
    assert raw_reads([module]) == []


def test_a_backend_part_round_trips_beside_the_core_fields(tmp_path):
    run = Run.create(tmp_path, "r")
    run.update_meta(backend="slurm", state="created")
    run.update_part(SlurmDetails, job_id="7", state="submitted")
    run.update_part(CloudDetails, instances=[{"id": "i-1"}], keep_cluster="k")
    run.update_part(access_part("ec2"), ec2={"region": "r", "security_group": "sg-1"})
    record = run.record()
    assert (record.backend, record.state) == ("slurm", "submitted")
    assert record.part(SlurmDetails).job_id == "7"
    assert record.part(CloudDetails).keep_cluster == "k"
    assert record.part(access_part("ec2")).ec2["security_group"] == "sg-1"
    assert record.part(SshDetails) == SshDetails()  # absent fields take the part's defaults
    on_disk = json.loads((run.dir / "run.json").read_text())  # one flat object, as before
    assert on_disk["job_id"] == "7" and on_disk["ec2"]["region"] == "r"
    assert RunRecord.from_json((run.dir / "run.json").read_text()) == record


def test_the_writers_refuse_fields_no_record_declares(tmp_path):
    run = Run.create(tmp_path, "r")
    with pytest.raises(TypeError, match="job_id is not a field of RunRecord"):
        run.update_meta(job_id="7")
    with pytest.raises(TypeError, match="ssh_hosts is not a field of SlurmDetails"):
        run.update_part(SlurmDetails, ssh_hosts={})
    assert run.record() == RunRecord()  # nothing was written
