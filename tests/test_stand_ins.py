"""The TensorFlow-free stand-ins the end-to-end tests run where the launcher is the subject
(tests/README.md): tflaunch.models.smoke's checkpoint on a warning signal, and its resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests.helpers import ROOT, read_until


def _chief(tmp_path, steps: int, step_seconds: float) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TF_CONFIG": json.dumps({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief"}}),
    }
    argv = [sys.executable, "-m", "tflaunch.models.smoke", "--steps", str(steps)]
    argv += ["--step-seconds", str(step_seconds), "--checkpoint-dir", str(tmp_path / "ckpt")]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


def test_smoke_chief_checkpoints_once_on_the_warning_signal_and_resumes_from_it(tmp_path):
    first = _chief(tmp_path, steps=10_000, step_seconds=0.05)
    try:
        read_until(first.stdout, "no checkpoint at", timeout=60)
        read_until(first.stdout, "chief:0 step 3/", timeout=60)
        first.send_signal(signal.SIGUSR1)
        said = read_until(first.stdout, "saved checkpoint", timeout=60)
        # one checkpoint per warning, however many copies follow
        first.send_signal(signal.SIGUSR1)
        later = "".join(read_until(first.stdout, "chief:0 step ", timeout=60) for _ in range(3))
    finally:
        first.kill()
        first.wait()
    assert "chief:0: got signal 10: checkpointing now" in said
    assert "checkpoint" not in later
    saved = int(said.rsplit(" at step ", 1)[1])
    assert saved >= 3

    second = _chief(tmp_path, steps=saved + 2, step_seconds=0)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0
    assert f"chief:0: resumed from {tmp_path / 'ckpt' / 'smoke-step'} at step {saved}" in out
    assert f"chief:0 step {saved + 1}/{saved + 2}" in out and f"step {saved}/" not in out
    assert (tmp_path / "ckpt" / "smoke-step").read_text() == str(saved + 2)
