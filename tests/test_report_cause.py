"""A failure report leads with its cause (issue 40): a known cause is the report's first sentence
with its fix, the PS semantics after it; the lines shown are those around the error, not the
tail of a dump that followed it."""

from __future__ import annotations

import io
import os
import socket
import sys
from pathlib import Path

import yaml

from tests.coordinator_fakes import FakeLink
from tests.helpers import FAKE_TASK, fake_cluster, free_port_base, tflaunch, write_cluster
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import make_plan
from tflaunch.cluster.plan import Host
from tflaunch.runtime import diagnose, procs
from tflaunch.runtime.coordinator import coordinate
from tflaunch.runtime.run import Run

DATA = Path(__file__).resolve().parent / "data"
KERAS3_LOG = DATA / "keras3_mwms_worker.log"  # worker:0 of examples/keras_mwms.py under Keras 3
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}


def tail_of(lines) -> diagnose.OutputTail:
    tail = diagnose.OutputTail()
    for line in lines:
        tail.append(line)
    return tail


def test_the_lines_around_an_error_outlive_the_dump_after_it():
    lines = [f"step {i}" for i in range(30)]
    lines += [
        "  File 'x.py', line 3, in fit",
        "ValueError: Attempt to convert a value (PerReplica:{",
    ]
    lines += [f"  0: <tf.Tensor: value={i}>" for i in range(40)]
    tail = tail_of(lines)
    assert tail.error_scrolled_out
    context = tail.context()
    assert context == lines[26:46]  # 5 lines before the error, the error, 14 after it
    assert context[5].startswith("ValueError: Attempt to convert")
    assert tail.hidden_after_window == 40 - 14
    # While the error is among the last lines, the last lines are what is shown.
    short = tail_of(lines[:40])
    assert not short.error_scrolled_out and short.context() == lines[20:40]


def test_keras_3s_per_replica_error_names_program_keras_legacy():
    tail = tail_of(KERAS3_LOG.read_text().splitlines())
    (note,) = diagnose.notes("worker:0", tail.context(), ("python3", "k.py"), None, "h", 1)
    assert note.startswith("Keras 3 cannot run this program's fit() across workers")
    assert "program.keras: legacy" in note and "tflaunch[keras2]" in note
    # Under keras: legacy already, the same error is not blamed on Keras 3.
    assert "keras: legacy" not in " ".join(
        diagnose.notes("worker:0", tail.context(), ("python3",), None, "h", 1, env=LEGACY)
    )


def test_tf_keras_missing_under_keras_legacy_names_the_keras2_extra():
    tail = [
        "WARNING:tensorflow:Your environment has TF_USE_LEGACY_KERAS set to True, but you do "
        "not have the tf_keras package installed. You must install it",
        "Traceback (most recent call last):",
        "ImportError: Keras cannot be imported. Check that it is installed.",
    ]
    (note,) = diagnose.notes("worker:0", tail, ("python3", "k.py"), "/usr/bin/python3", "h", 1)
    assert note.startswith("The task's Python has no tf_keras")
    assert "pip install 'tflaunch[keras2]'" in note and "python3 (/usr/bin/python3) on h" in note
    # Without TensorFlow's warning, "Keras cannot be imported" means tf_keras under legacy only.
    bare = tail[1:]
    assert "tf_keras" in diagnose.notes("worker:0", bare, ("python3",), None, "h", 1, env=LEGACY)[0]
    assert not diagnose.notes("worker:0", bare, ("python3",), None, "h", 1)[0].startswith(
        "The task's Python has no tf_keras"
    )


def test_a_port_taken_names_its_holder_from_the_process_table():
    port = free_port_base(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        found = procs.port_holder(port, "localhost")
    assert found is not None and found.startswith(f"pid {os.getpid()} (")
    line = "OSError: [Errno 98] Address already in use"
    (note,) = diagnose.notes(
        "ps:0", [line], ("python3",), None, "h", 1, address="h:1", holder=found
    )
    assert note.startswith(f"The task could not listen on its port h:1: {found} holds it")
    assert procs.port_holder(port, "localhost") is None  # nobody listens now


def cluster_without_its_script(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "train_missing.py"]})


def test_a_missing_script_that_slips_past_validate_leads_the_report(tmp_path):
    result = tflaunch("up", str(cluster_without_its_script(tmp_path)))
    assert result.returncode == 2, result.stderr
    report = result.stderr[result.stderr.index("failed: ") + len("failed: ") :]
    assert report.startswith(f"The task's script {tmp_path / 'train_missing.py'} does not exist")
    first, second = report.splitlines()[:2]
    assert "Fix: program.argv or program.workdir" in first
    assert " on localhost exited" in second  # which task ended how, after the cause


def test_a_missing_module_leads_the_ps_report(tmp_path):
    path = fake_cluster(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["program"]["argv"] = [sys.executable, "-m", "no_such_module_for_tflaunch_tests"]
    path.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(path))
    assert result.returncode == 1, result.stderr
    report = result.stderr[result.stderr.index("failed: ") + len("failed: ") :]
    assert report.startswith("The task's Python cannot import no_such_module_for_tflaunch_tests")
    assert str(FAKE_TASK) not in report


def test_the_mwms_tutorial_under_keras_3_gets_a_report_naming_keras_legacy(tmp_path):
    """The recorded output of TensorFlow's multi-worker Keras tutorial program under Keras 3
    (examples/keras_mwms.py, roles.ps: 0), fed to the coordinator as its agent would: the error
    line is 300 lines above the end of a tensor's dump."""
    config = parse_config("program: [python3, keras_mwms.py]\nroles: {ps: 0, worker: 1}\n")
    plan = make_plan(config, [Host("a", "10.0.0.1", "10.0.0.1")])
    log = KERAS3_LOG.read_text().splitlines()
    script = [{"event": "started", "task": "worker:0", "pid": 100}]
    script += [{"event": "output", "task": "worker:0", "line": line} for line in log]
    script += [{"event": "exited", "task": "worker:0", "code": 1}]
    outcome = coordinate(
        plan,
        Run.create(tmp_path / "runs", "t"),
        [FakeLink("a", ["worker:0"], script)],
        out=io.StringIO(),
    )
    assert outcome.code == 1
    first = outcome.message.split(". ")[0]
    assert first.startswith("Keras 3 cannot run") and "program.keras: legacy" in outcome.message
    report = outcome.message.splitlines()
    shown = report.index("its output around its last error, and its last lines:")
    assert any(line.startswith("    ValueError: Attempt to convert") for line in report[shown:])
    assert report[-2].endswith("to a Tensor.")  # the dump's last line, under the window


def test_keras_3_refusing_keras_2s_optimizers_names_program_keras_legacy():
    """The ParameterServerStrategy tutorial's tf.keras.optimizers.legacy under Keras 3."""
    tail = [
        "Traceback (most recent call last):",
        "ImportError: `keras.optimizers.legacy` is not supported in Keras 3. When using "
        "`tf.keras`, to continue using a `tf.keras.optimizers.legacy` optimizer, you can install "
        "the `tf_keras` package (Keras 2) and set the environment variable "
        "`TF_USE_LEGACY_KERAS=True` to configure TensorFlow to use `tf_keras`",
    ]
    (note,) = diagnose.notes("chief:0", tail, ("python3", "pss.py"), None, "h", 1)
    assert note.startswith("Keras 3 cannot run this program's Keras 2's API")
    assert "Fix: set program.keras: legacy" in note
