"""tflaunch tune: the pure parts (settings, ranking, caveats, the tuned file, the probe's argv)
and one end-to-end run on the local backend (slow: real TensorFlow processes)."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers import tflaunch, wait_until_gone, write_cluster
from tflaunch import launch
from tflaunch.cli import cli
from tflaunch.cluster.config import load_config, parse_config
from tflaunch.models import tune_probe
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.runtime.run import Run
from tflaunch.tools import perfmodel as pm
from tflaunch.tools import tune
from tflaunch.tools import tune_calibrate as tn
from tflaunch.tools import tune_model as tm
from tflaunch.tools import tune_settings as ts
from tflaunch.tools.tune_file import ClusterFile
from tflaunch.tools.tune_settings import Ranked, Setting

ROOT = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-m", "tflaunch.models.benchmark", "--model", "resnet50"]
PS, DR, CAR = "parameter_server", "distributed_replicated", "collective_all_reduce"


def test_a_benchmark_may_change_everything_another_program_what_it_passes() -> None:
    knobs = ts.Knobs.of(BENCH)
    assert knobs.updates == (PS, DR, CAR) and knobs.strategies == STRATEGIES and knobs.transfers
    mnist = ts.Knobs.of(["python", "-m", "tflaunch.models.mnist", "--variable_placement", "lpt"])
    assert mnist.updates == (PS,) and mnist.strategies == STRATEGIES and not mnist.transfers
    plain = ts.Knobs.of(["python", "train.py"])
    assert plain == ts.Knobs((PS,), ("round_robin",), False)


def test_every_setting_once_and_one_ps_only_round_robin() -> None:
    settings = ts.enumerate_settings(3, ts.Knobs.of(BENCH))
    assert len(settings) == len(set(settings))
    # PS: P=1 (1 placement) + P=2,3 (4 placements each) = 9, x 2 hosts, x 3 transfers;
    # replicated the same x 2 transfers; all-reduce once per way its gradients cross (4).
    assert len(settings) == 9 * 2 * 3 + 9 * 2 * 2 + 4
    assert {s.strategy for s in settings if s.ps == 1} == {"round_robin"}
    assert [s.transfer for s in settings if s.update == CAR] == [
        "none", "packed", "float16", "packed_float16",
    ]  # fmt: skip
    assert not any(s.transfer == "staged" for s in settings if s.update == DR)
    plain = ts.enumerate_settings(2, ts.Knobs.of(["python", "train.py"]), ("colocated",))
    assert plain == [Setting(1, PS), Setting(2, PS)]


def test_flags_are_set_replaced_and_removed() -> None:
    argv = ["p", "--a", "1", "--staged_vars", "--b=2", "--c", "3"]
    assert ts.with_flag(argv, "--a", "9") == ["p", "--staged_vars", "--b=2", "--c", "3", "--a", "9"]
    assert ts.with_flag(argv, "--b", None) == ["p", "--a", "1", "--staged_vars", "--c", "3"]
    assert ts.with_flag(argv, "--staged_vars", None, switch=True) == [
        "p", "--a", "1", "--b=2", "--c", "3",
    ]  # fmt: skip
    assert ts.flag_value(argv, "--b") == "2" and ts.flag_value(argv, "--z") is None
    knobs = ts.Knobs.of(BENCH)
    staged = ts.setting_argv(
        [*BENCH, "--transfer_order", "tic"], Setting(2, PS, "lpt", "staged"), knobs
    )
    assert staged[len(BENCH) :] == [
        "--variable_update", PS, "--variable_placement", "lpt", "--staged_vars",
    ]  # fmt: skip
    ring = ts.setting_argv([*BENCH, "--staged_vars"], Setting(0, CAR, "-", "none", "-"), knobs)
    assert ring[len(BENCH) :] == ["--variable_update", CAR]


def test_the_all_reduce_settings_set_packing_and_float16_and_ps_settings_drop_them() -> None:
    knobs = ts.Knobs.of(BENCH)
    packed = ts.setting_argv(BENCH, Setting(0, CAR, "-", "packed_float16", "-"), knobs)
    assert packed[len(BENCH) :] == [
        "--variable_update", CAR, "--gradient_repacking", "4", "--compact_gradient_transfer",
    ]  # fmt: skip
    given = [*BENCH, "--gradient_repacking=8", "--compact_gradient_transfer", "true"]
    float16 = ts.setting_argv(given, Setting(0, CAR, "-", "float16", "-"), knobs)
    assert float16[len(BENCH) :] == ["--variable_update", CAR, "--compact_gradient_transfer"]
    # tflaunch.models.benchmark refuses both flags with a PS update: they go, value and all
    ps = ts.setting_argv(given, Setting(2, PS, "lpt", "staged"), knobs)
    assert ps[len(BENCH) :] == [
        "--variable_update", PS, "--variable_placement", "lpt", "--staged_vars",
    ]  # fmt: skip
    assert Setting(0, CAR, "-", "packed_float16", "-").label == "all-reduce packed_float16"
    narrowed = ts.enumerate_settings(1, knobs.limited((CAR,), (), ("none", "float16")))
    assert narrowed == [Setting(0, CAR, "-", "none", "-"), Setting(0, CAR, "-", "float16", "-")]


@pytest.mark.parametrize(
    ("argv", "sync"),
    [
        ([], False),
        (["--cross_replica_sync"], True),
        (["--cross_replica_sync", "--model", "x"], True),
        (["--cross_replica_sync", "false"], False),
        (["--cross_replica_sync=True"], True),
        (["--cross_replica_sync=0"], False),
        (["--cross_replica_sync", "--cross_replica_sync=no"], False),
    ],
)
def test_the_programs_training_mode_is_read_as_the_benchmark_reads_it(argv, sync) -> None:
    knobs = ts.Knobs.of([*BENCH, *argv])
    assert knobs.sync is sync and knobs.limited().sync is sync
    assert ("synchronous PS steps" in knobs.mode) is sync


def _lab_inputs(rate_mb_s: float) -> pm.Inputs:
    """The many-core lab's second round (docs/performance.md): InceptionV3, batch 2, 3 cores a
    host, 331 ms of compute, gRPC 0.84 ns/B, a loaded PS 3,949 MB/s, the ring's 4.44 ns/B."""
    from tflaunch.models.registry import get_model_spec
    from tflaunch.tools.placement_command import model_variables

    variables = tuple(
        (v.name, tuple(v.shape), v.dtype_size)
        for v in model_variables(get_model_spec("inception3"), 1001)
    )
    return pm.Inputs(
        0.331, 2, variables, pm.Link(0.00065, rate_mb_s * 1e6), cpu_s_per_byte=0.84e-9,
        cores_per_host=3, ps_bytes_per_s=3.949e9, ring_cpu_s_per_byte=4.44e-9,
    )  # fmt: skip


@pytest.mark.tensorflow  # the model's variables: InceptionV3 built by Keras
def test_a_synchronous_program_is_ranked_in_its_mode_with_the_all_reduce_options() -> None:
    """16 workers and 2 dedicated PS at 1 Gb/s, as measured on the many-core lab: synchronous
    staged PS 3.84 img/s, the default ring 12.15, packed float16 all-reduce 22.80. tune puts the
    packed float16 all-reduce first, and predicts the PS settings in the synchronous mode."""
    inputs = _lab_inputs(117)
    layout = tm.Layout(tuple(f"w{i}" for i in range(16)), ("p0", "p1"))
    knobs = ts.Knobs.of([*BENCH, "--cross_replica_sync"]).limited((PS, CAR), ("lpt",))
    rows = []
    for setting in ts.enumerate_settings(2, knobs, ("dedicated",)):
        if setting.update == PS and setting.ps != 2:
            continue
        p = tm.predict_setting(inputs, layout, setting, sync=knobs.sync)
        rows.append(Ranked(setting, p.images_per_sec, p.step_s, p.bound))
    ranked = {r.setting.transfer if r.setting.update == CAR else r.setting.label: r
              for r in ts.rank(rows)}  # fmt: skip
    assert ts.rank(rows)[0].setting == Setting(0, CAR, "-", "packed_float16", "-")
    staged = ranked["2 PS dedicated lpt ps staged"].images_per_sec
    assert staged == pytest.approx(
        pm.predict(inputs, 16, 2, PS, "lpt", sync=True, staged=True).images_per_sec
    )
    assert 3.84 * 0.85 < staged < 3.84 * 1.15  # the model's figure against the lab's
    assert 12.15 * 0.85 < ranked["none"].images_per_sec < 12.15 * 1.15
    assert 22.80 * 0.85 < ranked["packed_float16"].images_per_sec < 22.80 * 1.15
    asynchronous = tm.predict_setting(inputs, layout, Setting(2, PS, "lpt", "staged", "dedicated"))
    assert asynchronous.images_per_sec != pytest.approx(staged, rel=0.02)  # another model


def test_synchronous_colocated_ps_and_ordered_reads_are_noted() -> None:
    ctx = ts.Context(4, 8, 1.25e8, 95_000_000, shared_cores=False, sync=True)
    colocated = Ranked(Setting(2, PS, "lpt", "tic", "colocated"), 2.0, 4.0, "ps")
    notes = ts.caveats(colocated, ctx)
    assert any("synchronous PS on the workers' hosts" in n for n in notes)
    assert any("ordered reads under the synchronous barrier" in n for n in notes)
    ring = Ranked(Setting(0, CAR, "-", "float16", "-"), 2.0, 4.0, "ring")
    assert ts.caveats(ring, ctx) == ()


def _row(ps: int, rate: float, **kw) -> Ranked:
    return Ranked(Setting(ps, PS, **kw), rate, 1.0, "workers")


def test_ranking_puts_the_simplest_first_among_ties_and_measures_the_margin() -> None:
    rows = [
        _row(3, 10.0, strategy="lpt"),
        _row(2, 10.05, strategy="lpt", transfer="staged"),
        _row(2, 9.98, strategy="lpt"),
        _row(1, 8.0),
    ]
    ranked = ts.rank(rows)
    assert [(r.setting.ps, r.setting.transfer) for r in ranked] == [
        (2, "none"), (2, "staged"), (3, "none"), (1, "none"),
    ]  # fmt: skip
    lead, tied = ts.margin(ranked)
    assert tied == 3 and lead == pytest.approx(9.98 / 8.0 - 1)
    assert ts.next_distinct(ranked).setting.ps == 1
    text = "\n".join(ts.verdict(ranked))
    assert "3 settings are predicted within 1 %" in text and "margin: 24.8 %" in text
    close = ts.verdict(ts.rank([_row(1, 10.0), _row(2, 9.7, strategy="lpt")]))
    assert any("within the model's error" in line for line in close)


def test_the_model_says_when_it_is_out_of_its_depth() -> None:
    ctx = ts.Context(2, 2, 1.25e9, 100_000_000, shared_cores=False)
    fast = Ranked(Setting(1, PS), 8.0, 0.25, "workers")  # 2 workers x 4 steps/s x 200 MB
    slow = Ranked(Setting(1, PS, ps_hosts="dedicated"), 1.0, 4.0, "ps")
    assert any("gRPC CPU" in n for n in ts.caveats(fast, ctx))
    assert ts.caveats(slow, ctx) == ()
    assert any("co-located PS" in n for n in ts.caveats(replace_rate(slow), ctx))
    beyond = ts.Context(8, 64, 1.25e8, 100_000_000, False, contention_measured_at=(4,))
    assert any("extrapolated" in n for n in ts.caveats(slow, beyond))
    noted = replace_rate(fast)
    assert any("out of its depth" in line for line in ts.verdict([noted]))
    # One host, loopback: staging and ordering hide gRPC's CPU only where cores are free.
    alone = ts.Context(8, 64, 1.3e9, 100_000_000, False, contention_measured_at=(8,), nic=False)
    staged = Ranked(Setting(1, PS, transfer="staged"), 100.0, 0.16, "workers")
    assert any("staged on one host" in n for n in ts.caveats(staged, alone))
    assert not any("on one host" in n for n in ts.caveats(staged, beyond))  # a NIC per host
    plain = Ranked(Setting(1, PS), 100.0, 0.16, "workers")
    assert not any("on one host" in n for n in ts.caveats(plain, alone))


def replace_rate(row: Ranked) -> Ranked:
    from dataclasses import replace

    ctx = ts.Context(2, 2, 1.25e9, 100_000_000, shared_cores=False)
    row = replace(row, setting=replace(row.setting, ps_hosts="colocated"))
    return replace(row, notes=ts.caveats(row, ctx))


def test_measured_settings_rank_above_unmeasured_ones_the_pick_first() -> None:
    a = Ranked(Setting(2, PS, "lpt"), 10.0, 1, "ps", measured=7.0)
    b = Ranked(Setting(1, PS), 9.0, 1, "ps", measured=8.0)
    c = Ranked(Setting(3, PS), 9.5, 1, "ps")
    d = Ranked(Setting(0, CAR, "-", "none", "-"), 12.0, 1, "ring", measured=6.0)
    assert ts.measured_first([c, a, b, d], b) == [b, a, d, c]
    assert ts.measured_first([c, a, b, d], d) == [d, b, a, c]  # the race picked d (within noise)
    line = ts.model_error_line([a, b, c])
    assert line is not None and "median error" in line and "over 2 settings" in line
    assert ts.model_error_line([c]) is None


def test_the_tuned_document_is_the_same_file_with_the_setting_and_it_validates() -> None:
    raw = {
        "name": "x",
        "program": {"argv": [*BENCH, "--staged_vars"], "workdir": "."},
        "roles": {"ps": 1, "worker": 3},
        "placement": {"ps": "colocated", "ps_per_host": 1},
        "supervision": {"ready_timeout": 30},
    }
    setting = Setting(2, DR, "lpt", "tic", "dedicated")
    argv = ts.setting_argv(raw["program"]["argv"], setting, ts.Knobs.of(BENCH))
    doc = ts.tuned_document(raw, setting, argv, 1)
    assert doc["roles"] == {"ps": 2, "worker": 3}
    assert doc["placement"] == {"ps": "dedicated", "workers_per_host": 1}
    assert doc["supervision"] == raw["supervision"] and raw["roles"]["ps"] == 1  # not mutated
    assert "--staged_vars" not in doc["program"]["argv"]
    assert doc["program"]["argv"][-6:] == [
        "--variable_update", DR, "--variable_placement", "lpt", "--transfer_order", "tic",
    ]  # fmt: skip
    config = parse_config(yaml.safe_dump(doc))
    assert config.roles.ps == 2 and config.placement.ps == "dedicated"
    ring = ts.tuned_document(raw, Setting(0, CAR, "-", "none", "-"), BENCH, 1)
    assert ring["roles"]["ps"] == 0 and ring["placement"] == raw["placement"]
    assert parse_config(yaml.safe_dump(ring)).roles.ps == 0


def test_probe_runs_the_program_alone() -> None:
    argv = ["p", "--job_name", "worker", "--task_index=1", "--ps_hosts", "a:1", "--x", "2"]
    assert tune_probe.lone_argv(argv) == ["p", "--x", "2"]
    assert tune_probe.rank("chief", 0, 1) == 0 and tune_probe.rank("worker", 0, 1) == 1
    assert tune_probe.rank("worker", 2, 0) == 2 and tune_probe.rank("ps", 0, 0) is None


def test_the_lone_result_carries_the_variables_and_garbage_in_them_is_a_clear_error() -> None:
    """The lone worker's ``tune-result:`` line (read back from its log in the run directory)
    brings the model's variables; a list that is not [name, [dims], dtype size] rows is a
    TuneError (tune's exit 2) naming what is wrong, never a traceback or a silent zero."""
    sub = SimpleNamespace(dir=Path("/runs/r1"))  # the run: only its directory is named
    rates = {"images_per_sec": {"worker": 2.5, "total": 2.5}, "step_times": [0.8, 0.9]}
    rows = [["conv/kernel", [3, 3, 3, 8], 4], ["fc/bias", [10], 4]]
    line = "tune-result: " + json.dumps({**rates, "variables": rows}) + "\n"
    result = tn.benchmark_result("noise\n" + line, "a lone worker", sub)
    assert result.variables == (("conv/kernel", (3, 3, 3, 8), 4), ("fc/bias", (10,), 4))
    assert result.worker == 2.5 and result.step_times == (0.8, 0.9)
    plain = tn.benchmark_result("tune-result: " + json.dumps(rates), "a worker", sub)
    assert plain.variables is None  # not asked for: the together run's workers
    garbage = (
        "rows", [], [["a", [3], 4, 5]], [[1, [3], 4]], [["a", "33", 4]], [["a", [-1], 4]],
        [["a", [3.5], 4]], [["a", [True], 4]], [["a", [3], 1e9]], [["a", [3], "4"]], [None],
    )  # fmt: skip
    for bad in garbage:
        with pytest.raises(ts.TuneError) as caught:
            tn.benchmark_result("tune-result: " + json.dumps({**rates, "variables": bad}), "w", sub)
        message = str(caught.value)
        assert "w reported a malformed result" in message and "/runs/r1" in message, message
        assert "\n" not in message and len(message) < 400, message


def test_netbench_sizes_come_from_the_variables() -> None:
    variables = (("a", (1000, 1000), 4), ("b", (10,), 4), ("c", (4000, 1000), 4))
    assert tn.netbench_sizes(variables) == [1024, 10_000_020, 20_000_040]  # largest: at most half
    huge = (("k", (10**9,), 4), ("b", (10,), 4))
    assert tn.netbench_sizes(huge) == [1024, 32 * 1024**2, 64 * 1024**2]


def _variables() -> tuple:
    # A 40 MB kernel and smaller ones, as a CNN's: placement decides where the bytes go.
    return (("k", (10_000_000,), 4), *((f"v{i}", (250_000 + 10_000 * i,), 4) for i in range(40)))


@pytest.mark.parametrize("shared", [False, True])
def test_alike_workers_get_what_perfmodel_gives(shared) -> None:
    inputs = pm.Inputs(0.2, 2, _variables(), pm.Link(1.3e-3, 113e6), shared_cores=shared)
    for workers in (1, 2, 3, 8):
        for ps in (1, 2, 4):
            for strategy in ("round_robin", "lpt"):
                layout = tm.Layout(
                    tuple(f"w{i}" for i in range(workers)), tuple(f"p{i}" for i in range(ps))
                )
                exact = pm.predict(inputs, workers, ps, PS, strategy)
                approx = tm.predict(inputs, layout, PS, strategy)
                assert approx.images_per_sec == pytest.approx(exact.images_per_sec, rel=0.03)
                overlapped = pm.predict(inputs, workers, ps, PS, strategy, overlap=True)
                mine = tm.predict(inputs, layout, PS, strategy, overlap=True)
                assert mine.images_per_sec == pytest.approx(overlapped.images_per_sec, rel=0.03)
                staged = pm.predict(inputs, workers, ps, PS, strategy, staged=True)
                mine = tm.predict(inputs, layout, PS, strategy, staged=True)
                # One phase a cycle: the PS's queue is fuller, Schweitzer's fixed point further
                # from the exact recursion (3.5 % at 8 workers, 1 PS).
                assert mine.images_per_sec == pytest.approx(staged.images_per_sec, rel=0.05)
    ring = tm.predict(inputs, tm.Layout(("a", "b"), ()), CAR)
    assert ring.images_per_sec == pm.predict(inputs, 2, 0, CAR).images_per_sec


def test_a_worker_beside_its_ps_is_faster_and_counts() -> None:
    """Co-located on a NIC: the worker on the PS's host reads it over loopback; asynchronous
    workers add up, so 1 PS beside a worker beats 1 PS on a host of its own."""
    inputs = pm.Inputs(0.3, 2, _variables(), pm.Link(1.3e-3, 113e6), shared_cores=True)
    beside = tm.predict(inputs, tm.Layout(("a", "b"), ("a",)), PS)
    apart = tm.predict(inputs, tm.Layout(("a", "b"), ("c",)), PS)
    assert beside.worker_steps_s[0] < beside.worker_steps_s[1]
    assert beside.images_per_sec > 1.5 * apart.images_per_sec
    assert apart.worker_steps_s[0] == pytest.approx(apart.worker_steps_s[1])
    # Round robin puts the 40 MB kernel on PS 0, beside worker 0: both gain over LPT's halves.
    rr = tm.predict(inputs, tm.Layout(("a", "b"), ("a", "b")), PS, "round_robin")
    lpt = tm.predict(inputs, tm.Layout(("a", "b"), ("a", "b")), PS, "lpt")
    assert rr.worker_steps_s[0] < lpt.worker_steps_s[0]
    loopback = pm.Inputs(0.3, 2, _variables(), pm.Link(1.3e-3, 113e6), nic=False)
    assert tm.predict(loopback, tm.Layout(("a", "a"), ("a",)), PS).images_per_sec == (
        pm.predict(loopback, 2, 1, PS).images_per_sec
    )


def test_staged_variables_hide_the_pull_behind_compute_and_push() -> None:
    """--staged_vars: the next step's pull crosses the link (PS to worker) while this step
    computes and pushes the other way, so a worker's cycle holds one phase, not two; ordered
    reads (tic) hide only the forward pass behind the pull."""
    link = pm.Link(1e-3, 100e6)
    model = (("k", (25_000_000,), 4),)  # 100 MB: one second each way on its own
    alone = pm.Inputs(0.2, 2, model, link, nic=False)
    plain = pm.predict(alone, 1, 1, PS)
    staged = pm.predict(alone, 1, 1, PS, staged=True)
    tic = pm.predict(alone, 1, 1, PS, overlap=True)
    assert plain.step_s == pytest.approx(0.2 + 2 * 1e-3 + 2.0)
    assert staged.step_s == pytest.approx(0.2 + 2 * 1e-3 + 1.0)
    # tic: the forward third (0.067 s) beside the pull, the backward two thirds after it
    assert tic.step_s == pytest.approx(2 * 1e-3 + 1.0 + 0.2 * 2 / 3 + 1.0)
    assert staged.step_s < tic.step_s < plain.step_s
    # Bound by the PS's link, two workers: staging still saves a phase per cycle (the queue
    # in each direction is the same), so it stays well ahead of the unstaged setting.
    two = pm.predict(alone, 2, 1, PS)
    two_staged = pm.predict(alone, 2, 1, PS, staged=True)
    assert two_staged.images_per_sec > 1.3 * two.images_per_sec
    # The layout model agrees on a NIC per host, a PS on a host of its own.
    nic = pm.Inputs(0.2, 2, model, link)
    layout = tm.Layout(("a", "b"), ("c",))
    assert tm.predict(nic, layout, PS, staged=True).images_per_sec == pytest.approx(
        pm.predict(nic, 2, 1, PS, staged=True).images_per_sec, rel=0.05
    )  # Schweitzer's fixed point against the exact recursion, as above
    # A synchronous step takes staged as before (assumption 10), overlap or staged alike.
    sync = pm.predict(alone, 2, 1, PS, sync=True, staged=True)
    assert sync.step_s == pm.predict(alone, 2, 1, PS, sync=True, overlap=True).step_s
    # The grid stages parameter_server alone (distributed_replicated takes no --staged_vars).
    rows = pm.grid(alone, [2], [1], updates=(PS, DR), strategies=("round_robin",), staged=True)
    assert rows[0].images_per_sec == two_staged.images_per_sec
    assert rows[1].images_per_sec == pm.predict(alone, 2, 1, DR).images_per_sec


def test_a_program_tune_cannot_read_needs_model_and_batch(tmp_path) -> None:
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "train.py"]})
    result = CliRunner().invoke(cli, ["tune", str(cluster)])
    assert result.exit_code == 2 and "--model NAME" in result.output
    assert not (tmp_path / "runs").exists()
    result = CliRunner().invoke(cli, ["tune", str(cluster), "--link", "fast"])
    assert result.exit_code == 2 and "--link 'fast'" in result.output


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its tune is given 900 s (a loaded machine), and then --apply
def test_tune_verify_apply_on_the_local_backend(tmp_path) -> None:
    """The whole command on real TensorFlow: calibration, the model, --verify 1 and --apply,
    which trains the tuned file; everything measured is in the tune run's directory.

    The least that still runs every phase on real clusters: one worker and its PS (the verify
    run and the applied one are a PS and a worker each: the probe's report mode for a PS, the
    program's own cluster), PS settings only with one PS, the fewest timed steps, and the link
    given (--link): netbench inside tune, between hosts, is test_tune_ssh.py's, and netbench's
    own loopback run test_netbench.py's. It was 2 workers, up to 2 PS and netbench: 12
    TensorFlow processes, 7 now."""
    pytest.importorskip("tensorflow")
    argv = [
        *BENCH, "--image_size", "32", "--batch_size", "2", "--num_batches", "4",
        "--num_warmup_batches", "1", "--job_name", "{job_name}", "--task_index", "{task_index}",
        "--ps_hosts", "{ps_hosts}", "--worker_hosts", "{worker_hosts}",
    ]  # fmt: skip
    program = {"argv": argv, "workdir": str(ROOT)}
    cluster = write_cluster(
        tmp_path / "c.yaml", program, roles={"ps": 1, "worker": 1},
        supervision={"ready_timeout": 300}, runs_dir=str(tmp_path / "runs"),
    )  # fmt: skip
    args = ["tune", str(cluster), "--steps", "2", "--warmup", "1", "--max-ps", "1"]
    args += ["--updates", PS, "--link", "50,1000", "--verify", "1", "--verify-steps", "1"]
    args += ["--apply"]
    result = tflaunch(*args, cwd=tmp_path, timeout=900)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    for phase in ("compute", "network", "model", "verify"):
        assert f"\n{phase}: " in out, out
    assert "a lone worker: " in out and "link given (--link): no netbench" in out
    assert "50 µs, 1000 MB/s on one host (loopback)" in out
    assert "verify-A1: " in out and "measured best: " in out and "timed steps a run" in out
    assert "phases: compute " in out
    tuned = tmp_path / "c.tuned.yaml"
    config = parse_config(tuned.read_text())
    assert (config.roles.ps, config.roles.worker) == (1, 1)
    assert "--num_batches" in config.program.argv
    runs = sorted((tmp_path / "runs").iterdir())
    tune_dir = next(r for r in runs if "-tune-" in r.name)
    document = json.loads((tune_dir / "tune.json").read_text())
    assert document["calibration"]["lone_img_s"] > 0 and document["ranked"]
    assert document["ranked"][0]["measured"] is not None
    assert {r["update"] for r in document["ranked"]} == {PS}  # --updates narrowed the grid
    pick = document["pick"]  # what tuned.yaml holds: the verified top setting
    assert pick == {k: document["ranked"][0][k] for k in pick}
    assert {"lone.log", "inputs.json", "tuned.yaml", "tune.txt"} <= {
        p.name for p in tune_dir.iterdir()
    }
    assert set(document["calibration"]["runs"]) == {"lone", "verify-A1"}
    lone = next((tune_dir / "runs").glob("*-lone-*/worker-0.log")).read_text()
    assert '"variables": [[' in lone and "tune-variables" not in lone  # no process of their own
    applied = [r for r in runs if r != tune_dir]
    assert len(applied) == 1  # the tuned file's own run, which trained
    assert "total images/sec" in (applied[0] / "worker-0.log").read_text()
    html = tflaunch(
        "report", tune_dir.name, "--runs-dir", str(tmp_path / "runs"), "--html", cwd=tmp_path
    )
    assert html.returncode == 0, html.stderr
    page = (tune_dir / "report.html").read_text()
    assert "Tune" in page and "tune.json" in page
    assert wait_until_gone(str(tmp_path)) == []


def test_unknown_cores_make_no_grpc_claim() -> None:
    fast = Ranked(Setting(1, PS), 8.0, 0.25, "workers")
    assert ts.caveats(fast, ts.Context(2, 0, 1.25e9, 100_000_000, shared_cores=True)) == ()


@pytest.mark.slow
def test_tune_any_program_from_a_traced_worker_and_model_from_that_run(tmp_path) -> None:
    """A program that is not the benchmark: one worker traced, its step less communication is
    the compute; only the PS count and hosts are tuned, and the file it writes validates. The
    traced one-worker run is then read by `tflaunch model --from-run`, and is also the trace of a
    plain TF1 program: the PS runs it plainly (the hook armed by its import), the worker behind a
    find_spec probe (tests/programs/find_spec_first.py). One TensorFlow cluster for what were
    three (test_trace_any.py traced a one-worker MNIST run of its own for `model`, and the same
    TF1 trainer, PS and worker, behind the probe)."""
    pytest.importorskip("tensorflow")
    program = ROOT / "tests" / "programs" / "tf1_between_graph.py"
    probe = ROOT / "tests" / "programs" / "find_spec_first.py"
    argv = [
        sys.executable, str(probe), str(program), "--job_name", "{job_name}",
        "--task_index", "{task_index}",
        "--ps_hosts", "{ps_hosts}", "--worker_hosts", "{worker_hosts}", "--train_steps", "150",
    ]  # fmt: skip
    cluster = write_cluster(
        tmp_path / "c.yaml", {"argv": argv}, roles={"ps": 1, "worker": 2},
        supervision={"ready_timeout": 300}, runs_dir=str(tmp_path / "runs"),
    )  # fmt: skip
    args = ["tune", str(cluster), "--model", "mnist", "--batch-size", "32", "--trace", "40:10"]
    result = tflaunch(*args, "--link", "1000,500", cwd=tmp_path, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert re.search(r"worker:0's \d+ traced steps: [\d.]+ ms each without communication", out)
    assert "link given (--link): no netbench" in out
    tuned = parse_config((tmp_path / "c.tuned.yaml").read_text())
    assert tuned.program.argv == tuple(argv)  # no flag the program does not take
    tune_dir = next(p for p in (tmp_path / "runs").iterdir() if "-tune-" in p.name)
    document = json.loads((tune_dir / "tune.json").read_text())
    assert {r["update"] for r in document["ranked"]} == {PS}
    assert set(document["calibration"]["runs"]) == {"traced"}
    assert wait_until_gone(str(tmp_path)) == []

    # the traced run: the PS and the worker on one time axis, the worker's steps marked
    runs = tune_dir / "runs"
    traced = runs / document["calibration"]["runs"]["traced"]
    trace = json.loads((traced / "trace" / "trace.json").read_text())
    names = {
        e["args"]["name"].split()[0]: e["pid"]
        for e in trace["traceEvents"]
        if e["name"] == "process_name"
    }
    assert set(names) == {"ps:0", "worker:0"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for task, pid in names.items():
        assert any(e["cat"] == "compute" and e["pid"] == pid for e in spans), task
    assert any(e["cat"] == "step" and e["pid"] == names["worker:0"] for e in spans)
    summary = json.loads((traced / "trace" / "trace_summary.json").read_text())
    assert summary["ps:0"]["per_step_ms"]["recv_wait"] > 0  # the PS served the worker's steps
    assert "TASK" in (traced / "trace" / "trace_summary.txt").read_text()
    assert "no trace" not in (tune_dir / "traced.log").read_text()
    model_args = ["--link", "50,1000", "--model", "mnist", "--batch-size", "50"]
    model = tflaunch(
        "model", "--from-run", traced.name, "--runs-dir", str(runs), *model_args,
        "--workers", "1,2,4", "--ps", "1,2", cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert model.returncode == 0, model.stdout[-2000:] + model.stderr[-2000:]
    assert f"from run {traced.name}: worker:0's" in model.stdout
    assert "Recommended per worker count:" in model.stdout
    rows = [
        x.split() for x in model.stdout.splitlines() if x.split()[:1] and x.split()[0].isdigit()
    ]
    assert {r[0] for r in rows} == {"1", "2", "4"}


def test_core_sharing_comes_from_the_kernel_and_the_cores() -> None:
    def probe(kernel: str, cpus: list[int]) -> dict:
        return {"kernel": kernel, "cpus": cpus, "cores": len(cpus)}

    assert tn.core_sharing([probe("a", [0, 1]), probe("a", [0, 1])]) == "shared"
    assert tn.core_sharing([probe("a", [0, 1]), probe("a", [2, 3])]) == "disjoint"
    assert tn.core_sharing([probe("a", [0, 1]), probe("b", [0, 1])]) == "apart"
    three = [probe("a", [0]), probe("b", [0]), probe("a", [1]), probe("b", [0, 1])]
    assert tn.core_sharing(three) == "shared"
    assert tn.core_sharing([probe("a", [0, 1])]) == "apart"


def test_workers_at_once_are_said_faster_when_they_measured_faster() -> None:
    # the lent 16-core machine: 6 at once 17.65 img/s each, one alone 14.64 ("0.83x slower")
    assert tn.relative_speed(17.65, 14.64) == "1.21x faster"
    assert tn.relative_speed(12.0, 14.4) == "1.20x slower"
    assert tn.relative_speed(14.4, 14.4) == "1.00x slower"


def _netbench(pairs) -> dict:
    rows = []
    for (src, dst), (small_s, slope) in pairs.items():
        for size, seconds in ((s, small_s + s / slope) for s in (1024, 1 << 20)):
            rows.append({"src_host": src, "dst_host": dst, "bytes": size, "median_s": seconds,
                         "src": f"/job:ps/task:0/{src}", "dst": f"/job:worker/task:0/{dst}"})  # fmt: skip
    return {"sizes": [1024, 1 << 20], "point_to_point": rows}


def test_netbench_gives_the_link_between_hosts_and_the_loopback_within_one() -> None:
    result = _netbench({("a", "a"): (1e-4, 1.5e9), ("a", "b"): (1e-3, 1.2e8)})
    link, loopback = tn.split_links(result)
    assert link.bandwidth == pytest.approx(1.2e8) and link.latency_s == pytest.approx(
        1e-3, rel=0.01
    )
    assert loopback.bandwidth == pytest.approx(1.5e9)
    one_host = _netbench({("a", "a"): (1e-4, 1.5e9)})
    link, loopback = tn.split_links(one_host)
    assert link is loopback and link.bandwidth == pytest.approx(1.5e9)
    link, loopback = tn.split_links(_netbench({("a", "b"): (1e-3, 1.2e8)}))
    assert loopback is None
    with pytest.raises(ts.TuneError):
        tn.split_links({"sizes": [1024], "point_to_point": []})


def _runnable_session(tmp_path: Path, cpus_per_task: int, lines: list[str]) -> tune.Session:
    argv = [*BENCH, "--batch_size", "2", "--job_name", "{job_name}", "--task_index",
            "{task_index}", "--ps_hosts", "{ps_hosts}", "--worker_hosts", "{worker_hosts}"]  # fmt: skip
    path = write_cluster(
        tmp_path / "c.yaml", {"argv": argv, "workdir": str(ROOT)}, roles={"ps": 1, "worker": 2},
        placement={"cpus_per_task": cpus_per_task} if cpus_per_task else {},
    )  # fmt: skip
    file = ClusterFile.read(path)
    options = tn.TuneOptions()
    program = tn.Program.of(file.config, options)
    return tune.Session(file, program, options, tn.Calibration(), lines.append)


def test_settings_beyond_the_cores_are_left_out_and_the_written_file_runs(tmp_path) -> None:
    """The file's own setting and every PS setting of its default grid bind more cores than
    this machine lets tasks use: none is ranked, and the tuned file passes up's checks."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs two cores to bind two workers")
    lines: list[str] = []
    session = _runnable_session(tmp_path, cores // 2, lines)  # 2 workers: every core
    inputs = pm.Inputs(0.5, 2, _variables(), pm.Link(1e-4, 1e9), nic=False)
    ranked = session.model(inputs, 2)
    assert ranked and {r.setting.update for r in ranked} == {CAR}
    assert session.left_out and {s.update for s, _ in session.left_out} == {PS, DR}
    for setting, reason in session.left_out:  # one host: dedicated PS do not plan
        bound = "placement.cpus_per_task binds its" in reason
        assert bound if setting.ps_hosts == "colocated" else "does not fit" in reason, reason
    assert any(line.startswith("left out: 1 PS colocated") for line in lines)
    run = Run.create(str(tmp_path / "runs"), "c-tune", None, 0o755)
    tuned = load_config(session.write(run))
    assert tuned.roles.ps == 0 and "collective_all_reduce" in tuned.program.argv
    plan = launch.plan_cluster(tuned)
    assert launch.backend_for(tuned.backend).check_here(tuned, plan) == []  # up would start it
    document = session.document()
    assert document["pick"]["update"] == CAR and len(document["left_out"]) == len(session.left_out)
    assert all(row["reason"] for row in document["left_out"])


def test_the_cores_calibration_measured_bound_the_binding(tmp_path) -> None:
    session = _runnable_session(tmp_path, 1, [])
    config = session.setting_config(Setting(0, CAR, "-", "none", "-"), session.program.argv)
    plan = launch.plan_cluster(config)
    assert tune.runnable_problem(config, plan, {}) is None or len(os.sched_getaffinity(0)) < 2
    problem = tune.runnable_problem(config, plan, {"localhost": 1})
    assert problem == (
        "localhost lets tasks use 1 cores, but placement.cpus_per_task binds its 2 tasks to 2"
    )


def test_a_setting_outside_the_models_depth_is_not_picked_unmeasured(tmp_path) -> None:
    lines: list[str] = []
    session = _runnable_session(tmp_path, 1, lines)
    staged = Ranked(Setting(1, PS, transfer="staged"), 12.0, 1, "ps", notes=("staged on one host",))
    plain = Ranked(Setting(1, PS), 10.0, 1, "ps")
    session.ranked = [staged, plain]
    assert session.choose() is plain and "outside the model's depth" in lines[-1]
    session.ranked = [replace(staged, measured=11.0), replace(plain, measured=10.5)]
    assert session.choose().setting == staged.setting  # measured: it may lead


class _Runs:
    """A calibrator's running half, stood in: each verify run's figure from a list per setting
    letter, relayed as the probe relays the benchmark's result (no cluster, no TensorFlow)."""

    def __init__(self, figures: dict[str, list[float]], stop_at: str = "") -> None:
        self.figures, self.stop_at, self.labels = figures, stop_at, []

    def probe_argv(self, argv, flags) -> list[str]:
        return [*argv, *flags]

    def launch(self, label: str, config):
        from types import SimpleNamespace

        self.labels.append(label)
        if label == self.stop_at:
            raise tn.TuneInterrupted(f"interrupted during {label} (exit 130).")
        assert "--report" in config.program.argv and "--num_batches" in config.program.argv
        return SimpleNamespace(dir=Path("runs") / label, label=label)

    def training_logs(self, sub, count: int) -> list[str]:
        letter, round_no = sub.label[len("verify-") :][0], int(sub.label[len("verify-") + 1 :])
        value = self.figures[letter][round_no - 1]
        result = {"images_per_sec": {"worker": value / 2, "total": value}, "step_times": [0.1]}
        return ["step 1\ntune-result: " + json.dumps(result) + "\n"]


def test_verify_races_the_top_settings_interleaved_and_keeps_their_spreads(tmp_path) -> None:
    lines: list[str] = []
    session = _runnable_session(tmp_path, 1, lines)
    session.options = replace(session.options, verify=2, verify_steps=3)
    session.cal.step_times = (0.1, 0.1, 0.1)
    a = Ranked(Setting(1, PS, "round_robin", "staged"), 12.0, 1, "ps")
    b = Ranked(Setting(1, PS), 11.0, 1, "ps")
    c = Ranked(Setting(0, CAR, "-", "none", "-"), 5.0, 1, "ring")
    runs = _Runs({"A": [10.0, 10.4, 9.9], "B": [10.2, 9.9, 10.1]})
    ranked = session.verify([a, b, c], runs)
    labels = ["verify-A1", "verify-B1", "verify-A2", "verify-B2", "verify-A3", "verify-B3"]
    assert runs.labels == labels  # A B A B A B; the third setting is not raced
    assert any(line.startswith("within noise: ") for line in lines)
    assert ranked[0].setting == b.setting  # within noise: the simpler (no staging)
    assert ranked[2] == c  # unmeasured after the measured
    document = session.document()
    verified = {r["transfer"]: r["verify"] for r in document["ranked"] if "verify" in r}
    assert verified["staged"]["runs"] == [10.0, 10.4, 9.9] and verified["none"]["spread"] > 0
    assert "verify" not in document["ranked"][2]
    stopped = _Runs({"A": [10.0], "B": [10.2]}, stop_at="verify-B1")
    with pytest.raises(tn.TuneInterrupted):
        session.verify([a, b], stopped)
    assert stopped.labels == ["verify-A1", "verify-B1"]  # Ctrl-C ends the race, not a failure


def test_staging_on_one_host_is_predicted_as_unstaged_and_ranked_after_it(tmp_path) -> None:
    """Over loopback the transfers take the cores staging would hide them behind (a 16-core
    machine measured staged at 0.94-0.98 of unstaged where the overlap predicted 1.25-1.35):
    on one host tune predicts staged as unstaged, so the simpler unstaged setting leads."""
    staged, plain = Setting(1, PS, transfer="staged"), Setting(1, PS)
    assert ts.modelled_as(staged, nic=False) == plain
    assert ts.modelled_as(staged, nic=True) == staged  # hosts of their own: the overlap holds
    ring = Setting(0, CAR, "-", "packed", "-")
    assert ts.modelled_as(ring, nic=False) == ring
    session = _runnable_session(tmp_path, 0, [])  # unpinned: every setting runs
    session.program = replace(
        session.program,
        knobs=session.program.knobs.limited((PS,), ("round_robin",), ("none", "staged")),
    )
    inputs = pm.Inputs(0.5, 2, _variables(), pm.Link(1e-4, 1e9), nic=False)
    ranked = session.model(inputs, 2)
    first_staged = next(i for i, r in enumerate(ranked) if r.setting.transfer == "staged")
    twin = next(
        r for r in ranked if r.setting == replace(ranked[first_staged].setting, transfer="none")
    )
    assert ranked[first_staged].images_per_sec == twin.images_per_sec
    assert ranked.index(twin) < first_staged and "predicted as unstaged" in " ".join(
        ranked[first_staged].notes
    )


def test_calibration_runs_without_the_ps_where_the_files_own_setting_cannot_start(
    tmp_path,
) -> None:
    """A file whose own setting binds more cores than this machine has is calibrated on its
    workers alone (a PS's probe computes nothing); one whose workers alone cannot start is
    refused before anything runs."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs two cores to bind two workers")
    (tmp_path / "fits").mkdir()
    (tmp_path / "big").mkdir()
    config = _runnable_session(tmp_path, cores // 2, []).config  # 1 PS + 2 workers: too many
    calibrated, problem = tune.calibration_config(config)
    assert calibrated.roles.ps == 0 and calibrated.roles.worker == 2
    assert problem is not None and "cpus_per_task binds its 3 tasks" in problem
    fits = _runnable_session(tmp_path / "fits", 0, []).config  # unpinned: it starts as it is
    assert tune.calibration_config(fits) == (fits, None)
    big = _runnable_session(tmp_path / "big", cores, []).file.path  # each worker: every core
    result = CliRunner().invoke(cli, ["tune", str(big)])
    assert result.exit_code == 2 and "not even the file's workers can start here" in result.output
    assert not (tmp_path / "big" / "runs").exists()
