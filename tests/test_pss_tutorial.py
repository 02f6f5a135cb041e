"""TensorFlow's ParameterServerStrategy tutorial as it is written (issue 40): workers and PS that
``join()`` their server forever, a chief that trains with ``Model.fit`` and exits. With no
supervision settings the run ends ``succeeded`` soon after the chief's exit, not at
``finish_timeout`` (slow: real TensorFlow; one of the few tests where TensorFlow is the subject).
The policy itself is tested without TensorFlow in tests/test_success_policy.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from tests.helpers import tensorflow_module, tflaunch, wait_until_gone, write_cluster

pytestmark = tensorflow_module("tf_keras")
TUTORIAL = Path(__file__).resolve().parent / "programs" / "pss_tutorial.py"


def test_the_pss_tutorial_succeeds_with_default_supervision_soon_after_the_chief(tmp_path):
    program = {
        "argv": [sys.executable, str(TUTORIAL)],
        "keras": "legacy",
        "env": {"TEST_MARKER": str(tmp_path)},
    }
    path = write_cluster(tmp_path / "pss.yaml", program, roles={"ps": 1, "worker": 1, "chief": 1})
    data = yaml.safe_load(path.read_text())
    data.pop("supervision")  # default supervision: nothing says how the run ends
    path.write_text(yaml.safe_dump(data))
    result = tflaunch("up", str(path), timeout=420)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "chief done: loss" in result.stdout
    assert "chief:0 finished and worker:0, idle since, was serving: stopped" in result.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    chief_exit = next(
        e["time"] for e in events if e.get("event") == "exited" and e.get("task") == "chief:0"
    )
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded"
    assert record["ended"] - chief_exit < 60  # the behaviour timed: the end follows the chief
    assert wait_until_gone(str(tmp_path)) == []
