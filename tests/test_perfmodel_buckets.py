"""The performance model's all-reduce in buckets and float16's CPU (assumption 11, issue 42): the
bucket count and the size suggested for a link, each bucket's ring round, the casts' CPU on a
host's cores, and ``tflaunch model --all-reduce-bucket-mb`` (pure)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from tflaunch.cli import cli
from tflaunch.tools import perfmodel as pm

MB = 1_000_000
# Four float32 variables: 4, 2, 1 and 1 MB (8 MB; 4 MB as float16).
VARS = tuple((f"v{i}", (mb * MB // 4,), 4) for i, mb in enumerate((4, 2, 1, 1)))
LINK = pm.Link(latency_s=0.001, bandwidth=100 * MB)
RING = "collective_all_reduce"


def _inputs(**kw) -> pm.Inputs:
    return pm.Inputs(
        **{"compute_s": 0.6, "batch_size": 32, "variable_bytes": VARS, "link": LINK, **kw}
    )


def test_buckets_are_the_wire_bytes_over_the_size() -> None:
    inputs = _inputs()
    assert pm.ring_buckets(inputs, compact=False, bucket_bytes=0) == 1
    assert pm.ring_buckets(inputs, compact=False, bucket_bytes=3 * MB) == 3  # 8 MB
    assert pm.ring_buckets(inputs, compact=True, bucket_bytes=3 * MB) == 2  # 4 MB
    assert pm.ring_buckets(inputs, compact=False, bucket_bytes=100 * MB) == 1


def test_the_suggested_bucket_balances_the_first_wait_against_the_rounds() -> None:
    inputs = _inputs()  # backward pass 0.4 s; a ring round at 8 workers 14 ms
    wire = 8 * MB
    expected = wire * math.sqrt(14e-3 / 0.4)
    assert pm.suggest_bucket_bytes(inputs, 8) == pytest.approx(expected, abs=1)
    assert pm.suggest_bucket_bytes(inputs, 8, compact=True) == pytest.approx(expected / 2, abs=1)
    # a slower round wants bigger buckets; never more than the wire nor less than a 64th of it
    slow = _inputs(link=pm.Link(latency_s=0.05, bandwidth=100 * MB))
    assert pm.suggest_bucket_bytes(slow, 8) == wire
    fast = _inputs(link=pm.Link(latency_s=1e-9, bandwidth=100 * MB))
    assert pm.suggest_bucket_bytes(fast, 8) == wire // 64


def test_buckets_overlap_like_packs_and_pay_a_round_each() -> None:
    inputs = _inputs(ring_cpu_s_per_byte=5e-9)
    w = 4
    packed = pm.predict(inputs, w, 0, RING, packs=4)
    bucketed = pm.predict(inputs, w, 0, RING, bucket_bytes=2 * MB)  # 4 buckets of the 8 MB
    rounds = 3 * 2 * (w - 1) * LINK.latency_s
    # the 3 extra rounds are on the link, of which 3/4 overlap the backward pass
    assert bucketed.step_s == pytest.approx(packed.step_s + rounds / 4)


def test_float16_costs_the_casts_cpu_on_the_hosts_cores() -> None:
    w = 4
    plain = pm.predict(_inputs(), w, 0, RING, compact=True)
    # cores not modelled: no CPU term (the hand-checked cases of test_perfmodel stay)
    assert pm.predict(_inputs(cores_per_host=0), w, 0, RING, compact=True) == plain
    two = pm.predict(_inputs(cores_per_host=2), w, 0, RING, compact=True)
    casts = 8 * MB * pm.FLOAT16_CPU_S_PER_BYTE / 2
    assert two.step_s == pytest.approx(plain.step_s + casts)
    # float32 on the wire casts nothing
    assert pm.predict(_inputs(cores_per_host=2), w, 0, RING) == pm.predict(_inputs(), w, 0, RING)


def test_cli_takes_a_bucket_size_and_suggests_one(tmp_path) -> None:
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(_inputs().to_dict()))
    args = ["model", "--inputs", str(path), "--workers", "1,8", "--ps", "1", "--all"]
    out = CliRunner().invoke(
        cli, [*args, "--all-reduce-bucket-mb", "2", "--compact-gradient-transfer"]
    )
    assert out.exit_code == 0, out.output
    assert "all-reduce: buckets of 2.0 MB, float16 on the wire" in out.output
    mb = pm.suggest_bucket_bytes(_inputs(), 8, compact=True) / 1e6
    assert f"all-reduce bucket for 8 workers on this link: --all_reduce_bucket_mb {mb:.1f}" in (
        out.output
    )
    assert "bucket for 1 workers" not in out.output  # one worker reduces nothing
    row = next(
        line.split() for line in out.output.splitlines() if line.startswith("8 ") and RING in line
    )
    expected = pm.predict(_inputs(), 8, 0, RING, compact=True, bucket_bytes=2 * MB)
    assert row[4] == f"{expected.images_per_sec:.1f}"
    refused = CliRunner().invoke(cli, [*args, "--all-reduce-bucket-mb", "-1"])
    assert refused.exit_code == 2
