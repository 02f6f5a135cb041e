"""examples/keras-mwms.yaml: TensorFlow's multi-worker Keras tutorial program trains through
``tflaunch up`` with ``program.keras: legacy`` (tf_keras), on free ports (slow: real TensorFlow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import tflaunch, wait_until_gone, write_cluster
from tflaunch.cluster.config import parse_config
from tflaunch.cluster.placement import hosts_from_config, make_plan
from tflaunch.cluster.render import render_task
from tflaunch.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_keras_legacy_sets_tf_use_legacy_keras_for_every_task():
    config = parse_config("program: {argv: [p], keras: legacy}\nroles: {ps: 1, worker: 2}\n")
    plan = make_plan(config, hosts_from_config(config))
    assert {render_task(plan, t).env["TF_USE_LEGACY_KERAS"] for t in plan.tasks} == {"1"}
    default = parse_config("program: [p]\n")
    assert "TF_USE_LEGACY_KERAS" not in make_plan(default, hosts_from_config(default)).program.env
    with pytest.raises(ConfigError, match="program.keras: legacy sets it to 1; keep one"):
        parse_config("program: {argv: [p], keras: legacy, env: {TF_USE_LEGACY_KERAS: '0'}}\n")
    with pytest.raises(ConfigError, match="program.keras"):
        parse_config("program: {argv: [p], keras: 2}\n")


@pytest.mark.slow
def test_keras_mwms_example_trains_with_legacy_keras(tmp_path):
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    example = yaml.safe_load((EXAMPLES / "keras-mwms.yaml").read_text())
    program = {
        **example["program"],
        "argv": [sys.executable, *example["program"]["argv"][1:]],
        "workdir": str(EXAMPLES),
        "env": {"TEST_MARKER": str(tmp_path)},
    }
    cluster = write_cluster(
        tmp_path / "keras.yaml", program, name=example["name"], roles=example["roles"]
    )
    result = tflaunch("up", str(cluster), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for worker in ("worker:0", "worker:1"):
        assert f"[{worker}] tf.keras is tf_keras; 2 workers" in result.stdout  # Keras 2
    accuracy = [
        float(line.rsplit(":", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("[worker:0] final accuracy:")
    ]
    assert accuracy and accuracy[0] > 0.5, result.stdout[-2000:]
    assert wait_until_gone(str(tmp_path)) == []
