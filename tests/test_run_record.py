"""run.json is read and written in one place: :class:`tflaunch.runtime.run.Run` (the typed
:class:`RunRecord`, and the backends' parts of it). A scan of the shipped package finds any other
module that reads the file raw; the writers refuse fields no record or part declares."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.helpers import python_files
from tflaunch.launchers.clouds.records import (
    CloudDetails,
    InstanceRecord,
    access_part,
    add_instances,
    instance_records,
    mark_terminated,
)
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


def test_instance_records_are_read_typed_and_entries_that_are_not_records_left_out(tmp_path):
    run = Run.create(tmp_path, "r")
    made = InstanceRecord("i-1", "worker-1", "c5.xlarge", "worker", True, 0.17, 1.0, None, "k")
    other = InstanceRecord("i-2", "ps-1", "c5.xlarge", "ps")
    add_instances(run, [made])
    add_instances(run, [other])
    assert instance_records(run) == [made, other]
    assert json.loads(run.meta_path.read_text())["instances"][0]["type"] == "c5.xlarge"
    bad = [{"id": 7}, "i-3", {**made.to_json(), "spot": "yes"}, {**made.to_json(), "launched": "x"}]
    run.update_part(CloudDetails, instances=[made.to_json(), *bad])
    assert instance_records(run) == [made]
    mark_terminated(run, {"i-1"})
    (ended,) = instance_records(run)
    assert ended.terminated is not None and ended.kept == "k"


def test_a_backend_part_round_trips_beside_the_core_fields(tmp_path):
    run = Run.create(tmp_path, "r")
    run.update_meta(backend="slurm", state="created")
    run.update_part(SlurmDetails, job_id="7", state="submitted")
    run.update_part(CloudDetails, instances=[{"id": "i-1"}], keep_cluster="k")
    run.update_part(access_part("ec2"), ec2={"region": "r", "network": "sg-1"})
    record = run.record()
    assert (record.backend, record.state) == ("slurm", "submitted")
    assert record.part(SlurmDetails).job_id == "7"
    assert record.part(CloudDetails).keep_cluster == "k"
    assert record.part(access_part("ec2")).ec2["network"] == "sg-1"
    assert record.part(SshDetails) == SshDetails()  # absent fields take the part's defaults
    on_disk = json.loads((run.dir / "run.json").read_text())  # one flat object, as before
    assert on_disk["job_id"] == "7" and on_disk["ec2"]["region"] == "r"
    assert RunRecord.from_json((run.dir / "run.json").read_text()) == record


def test_the_writers_refuse_fields_no_record_declares(tmp_path):
    run = Run.create(tmp_path, "r")
    before = run.record()
    with pytest.raises(TypeError, match="job_id is not a field of RunRecord"):
        run.update_meta(job_id="7")
    with pytest.raises(TypeError, match="ssh_hosts is not a field of SlurmDetails"):
        run.update_part(SlurmDetails, ssh_hosts={})
    assert run.record() == before  # nothing was written


# One writer process: rewrites its own field of run.json ``n`` times, checking each time that its
# last value is still there (another writer's read-modify-write may have put back an older one);
# prints how many of its updates it found lost. ``unlocked``: flock does nothing, as before.
WRITER = """
import fcntl, pathlib, sys, time
from tflaunch.runtime.run import Run
run_dir, field, n, unlocked = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
if unlocked:
    fcntl.flock = lambda fd, operation: None
run = Run(pathlib.Path(run_dir).name, pathlib.Path(run_dir))
go = pathlib.Path(run_dir) / "go"
while not go.exists():
    time.sleep(0.01)
lost = 0
for i in range(1, n + 1):
    run.update_meta(**{field: i})
    if getattr(run.record(), field) != i:
        lost += 1
print(lost)
"""
WRITER_FIELDS = ("exit_code", "created", "started", "ended")


def concurrent_writers(run_dir: Path, n: int, unlocked: bool) -> list[int]:
    """Start one writer process per field of WRITER_FIELDS, let them go at once; their losses."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(run_dir), name, str(n), "1" if unlocked else "0"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for name in WRITER_FIELDS
    ]
    (run_dir / "go").touch()
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), outputs
    return [int(out) for out in outputs]


def test_concurrent_writers_of_different_fields_lose_no_update(tmp_path):
    """Real processes (a coordinator, a watcher, a ``status`` refresh) each rewrite the file: under
    the run directory's lock, none puts back a field another one changed."""
    run = Run.create(tmp_path, "r")
    run.update_meta(state="running")
    n = 150
    assert concurrent_writers(run.dir, n, unlocked=False) == [0] * len(WRITER_FIELDS)
    record = run.record()
    assert [getattr(record, f) for f in WRITER_FIELDS] == [n] * len(WRITER_FIELDS)
    assert record.state == "running"


def test_without_the_lock_concurrent_writers_lose_updates(tmp_path):
    """The check above can fail: the same writers with flock made a no-op lose updates."""
    run = Run.create(tmp_path, "r")
    losses = concurrent_writers(run.dir, 150, unlocked=True)
    record = run.record()
    final_lost = sum(getattr(record, f) != 150 for f in WRITER_FIELDS)
    assert sum(losses) + final_lost > 0, losses
