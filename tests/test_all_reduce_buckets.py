"""``--all_reduce_bucket_mb``: the gradients' all-reduce in buckets, in the order the backward pass
produces them, each launched as soon as its gradients exist. The cut (no TensorFlow), the flag
checks, and one traced step on two replicas (tests/programs/bucketed_all_reduce.py): what each
bucket's collective waits for, and that the bucketed step updates the weights exactly as one
all-reduce does, in float32 and in float16 on the wire."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers import run_program
from tflaunch.models.benchmark_runners.common import BenchmarkError, cut_buckets

TINY = ["--model", "inception3", "--image_size", "75", "--batch_size", "2"]


def test_buckets_close_once_they_hold_the_size() -> None:
    nbytes = [400, 10, 300, 20, 200, 30, 100]
    backward = [6, 5, 4, 3, 2, 1, 0]
    assert cut_buckets(backward, nbytes, 0) == [backward]
    assert cut_buckets(backward, nbytes, 10_000) == [backward]
    # 100+30+200 = 330 >= 300: closed; 20+300 = 320: closed; 10+400
    assert cut_buckets(backward, nbytes, 300) == [[6, 5, 4], [3, 2], [1, 0]]
    assert cut_buckets(backward, nbytes, 1) == [[i] for i in backward]
    assert cut_buckets([], nbytes, 300) == []
    # the order given is kept, whatever it is (the graph's, not the variables')
    assert cut_buckets([2, 0, 1], [5, 5, 5], 10) == [[2, 0], [1]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--all_reduce_bucket_mb", "4"], "use --variable_update collective_all_reduce"),
        (
            ["--variable_update", "collective_all_reduce", "--all_reduce_bucket_mb", "-1"],
            "--all_reduce_bucket_mb must not be negative",
        ),
        (
            ["--variable_update", "collective_all_reduce", "--all_reduce_bucket_mb", "4"]
            + ["--gradient_repacking", "4"],
            "give one of them",
        ),
    ],
)
def test_bad_bucket_flags(argv, message) -> None:
    from tflaunch.models.benchmark import build_parser, validate

    with pytest.raises(BenchmarkError, match=message):
        validate(build_parser().parse_args([*TINY, *argv]))


@pytest.mark.tensorflow  # a valid argv reaches validate()'s data-format check (nets/layers.py)
def test_bucket_flag_with_float16_is_accepted() -> None:
    from tflaunch.models.benchmark import build_parser, validate

    args = build_parser().parse_args(
        [*TINY, "--variable_update", "collective_all_reduce", "--all_reduce_bucket_mb", "2.5"]
        + ["--compact_gradient_transfer"]
    )
    validate(args)
    assert args.all_reduce_bucket_mb == 2.5


def test_buckets_start_before_the_backward_pass_ends_and_match_one_all_reduce(tmp_path) -> None:
    pytest.importorskip("tensorflow")
    out = tmp_path / "steps.json"
    run_program("tests/programs/bucketed_all_reduce.py", str(out))
    plain32, buckets32, plain16, buckets16 = json.loads(out.read_text())
    n = len(plain32["weights"])
    backward = list(range(n - 1, -1, -1))  # a chain of layers: the last layer's first
    for plain, bucketed, count in ((plain32, buckets32, 4), (plain16, buckets16, 3)):
        # one all-reduce of everything waits for every gradient, the first layer's included
        assert plain["waits_for"] == [list(range(n))]
        # the buckets go in the backward pass's order, one collective each
        buckets = bucketed["buckets"]
        assert len(buckets) == count and [i for b in buckets for i in b] == backward
        assert len(bucketed["waits_for"]) == count
        for k, waits in enumerate(bucketed["waits_for"]):
            # bucket k's collective waits for its own gradients and the buckets before it (the
            # collectives are chained in launch order), never for a later bucket's: it can start
            # while the backward pass still computes those
            assert set(waits) == {i for b in buckets[: k + 1] for i in b}, (k, waits)
        # the first layer's weight gradient (the backward pass's last) is not waited for
        assert 0 not in bucketed["waits_for"][0]
        # the same update, to the bit: each element's sum over the replicas is the same sum
        for a, b in zip(plain["weights"], bucketed["weights"], strict=True):
            np.testing.assert_array_equal(np.array(a), np.array(b))
    # and the step did something: float16 on the wire moved the weights too, a little apart
    moved = [np.abs(np.array(a) - np.array(b)).max() for a, b in zip(
        plain32["weights"], plain16["weights"], strict=True)]  # fmt: skip
    assert 0 < max(moved) < 1e-2
