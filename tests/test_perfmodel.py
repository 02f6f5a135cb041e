"""The performance model: its arithmetic on hand-checked cases, its inputs, the recommendation,
and the bench table of prediction beside measurement (pure)."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from tflaunch.cli import cli
from tflaunch.tools import perfmodel as pm
from tflaunch.tools import perfmodel_inputs as pi
from tflaunch.tools.bench_results import Point, Row
from tflaunch.tools.perfmodel_text import measured_lines

MB = 1_000_000
# Four float32 variables: 4, 2, 1 and 1 MB (shape (n,), 4 bytes each), in creation order.
VARS = tuple((f"v{i}", (mb * MB // 4,), 4) for i, mb in enumerate((4, 2, 1, 1)))
LINK = pm.Link(latency_s=0.001, bandwidth=100 * MB)


def _inputs(**kw) -> pm.Inputs:
    return pm.Inputs(
        **{"compute_s": 0.5, "batch_size": 32, "variable_bytes": VARS, "link": LINK, **kw}
    )


def test_parameter_server_is_a_closed_queueing_network() -> None:
    inputs = _inputs()
    # 1 PS holds 8 MB: a phase is 0.08 s each way; step 0.5 + 2 ms + 0.16 s = 0.662 s.
    one = pm.predict(inputs, 1, 1, "parameter_server")
    assert one.images_per_sec == pytest.approx(32 / 0.662)
    assert one.bound == "workers"
    # Mean-value analysis, by hand: at n = 1 the PS holds 0.08 / 0.662 transfers on average, so
    # the second worker's phase is 0.08 (1 + 0.08 / 0.662).
    phase = 0.08 * (1 + 0.08 / 0.662)
    two = pm.predict(inputs, 2, 1, "parameter_server")
    assert two.images_per_sec == pytest.approx(32 * 2 / (0.502 + 2 * phase))
    # Many workers: the PS's link, full duplex (pulls out, pushes in at once), caps them at
    # 100 MB/s / 8 MB = 12.5 steps/s, and the PS is what binds.
    many = pm.predict(inputs, 64, 1, "parameter_server")
    assert many.bound == "ps" and many.images_per_sec == pytest.approx(12.5 * 32, rel=0.03)
    eight = pm.predict(inputs, 8, 1, "parameter_server")
    assert eight.images_per_sec < min(8 / 0.662, 12.5) * 32
    # lpt at 2 PS: {4} and {2, 1, 1}: 4 MB each; round robin: {4, 1} = 5 MB on PS 0.
    assert pm.bytes_per_ps(inputs, 2, "lpt") == (4 * MB, 4 * MB)
    assert pm.bytes_per_ps(inputs, 2, "round_robin") == (5 * MB, 3 * MB)
    lpt = pm.predict(inputs, 8, 2, "parameter_server", "lpt")
    rr = pm.predict(inputs, 8, 2, "parameter_server", "round_robin")
    assert lpt.images_per_sec > rr.images_per_sec


def test_a_workers_own_nic_carries_the_whole_model() -> None:
    # With a NIC per host, a lone worker pulls all 8 MB through its own link whatever P is;
    # over loopback (no NIC) its pulls from 2 PS of 4 MB each go in parallel.
    nic = pm.predict(_inputs(), 1, 2, "parameter_server", "lpt")
    loopback = pm.predict(_inputs(nic=False), 1, 2, "parameter_server", "lpt")
    assert nic.step_s == pytest.approx(0.502 + 2 * 0.08)
    assert loopback.step_s == pytest.approx(0.502 + 2 * 0.04)


def test_shared_cores_queue_the_workers_compute() -> None:
    # Two workers on the cores one lone worker filled: at most 1 / 0.5 s = 2 steps/s together.
    shared = pm.predict(_inputs(shared_cores=True), 16, 4, "parameter_server", "lpt")
    assert shared.bound == "cores" and shared.images_per_sec == pytest.approx(2 * 32, rel=0.02)
    ring = pm.predict(_inputs(shared_cores=True), 2, 0, "collective_all_reduce")
    assert ring.step_s == pytest.approx(2 * 0.5 + 0.08 + 0.002 + 2 * 0.001 * 4)


def test_per_variable_cost_and_replicated_match_ps() -> None:
    a = pm.predict(_inputs(per_variable_s=0.001), 1, 1, "parameter_server")
    assert a.step_s == pytest.approx(0.662 + 2 * 0.001 * 4)
    b = pm.predict(_inputs(), 2, 2, "distributed_replicated", "lpt")
    assert b.images_per_sec == pytest.approx(
        pm.predict(_inputs(), 2, 2, "parameter_server", "lpt").images_per_sec
    )


def test_ring_all_reduce_pays_a_round_trip_per_variable() -> None:
    # W = 4: 2 * 3/4 * 8 MB / 100 MB/s = 0.12 s, the ring's 2 * 3 latencies of 1 ms, and one
    # round trip (2 ms) for each of the 4 variables.
    p = pm.predict(_inputs(), 4, 0, "collective_all_reduce")
    assert p.step_s == pytest.approx(0.5 + 0.12 + 0.006 + 0.008)
    assert p.images_per_sec == pytest.approx(4 * 32 / 0.634)
    assert pm.predict(_inputs(), 1, 0, "collective_all_reduce").step_s == pytest.approx(0.5)


def test_a_phase_waits_for_its_last_ps() -> None:
    # Two PS of 4 MB each (lpt): an arriving worker finds the others' transfers at both, and its
    # phase lasts until the later one ends: the queueing part is stretched by H(2) = 1.5.
    assert pm.harmonic(1) == 1 and pm.harmonic(2) == 1.5 and pm.harmonic(1.5) == 1.25
    inputs = _inputs(nic=False)
    one = pm.predict(inputs, 1, 2, "parameter_server", "lpt")
    in_phase = 0.04 / one.step_s  # workers in a pull phase with one worker
    two = pm.predict(inputs, 2, 2, "parameter_server", "lpt")
    assert two.step_s == pytest.approx(0.502 + 2 * 0.04 * (1 + 1.5 * in_phase))


def test_staged_phases_are_not_stretched_and_saturate_the_ps_links() -> None:
    """Staged pulls and pushes keep both directions of a PS's link busy: no H(P_eff) stretch.
    20 workers on two 4 MB PS: each PS moves 4 MB per worker-step each way at 100 MB/s, 25
    steps/s at most; the unstaged steps, stretched, stay near 2/3 of that (1/H(2))."""
    assert pm.fork_stretch([0.04, 0.04], staged=True) == 1.0
    assert pm.fork_stretch([0.04, 0.04]) == 1.5 and pm.fork_stretch([]) == 1.0
    inputs = _inputs(nic=False, compute_s=0.05)
    bound = 2 * 100 * MB / (8 * MB)  # worker-steps a second through the two PS
    staged = pm.predict(inputs, 20, 2, "parameter_server", "lpt", staged=True)
    assert 0.9 * bound < 20 / staged.step_s <= bound and staged.bound == "ps"
    unstaged = pm.predict(inputs, 20, 2, "parameter_server", "lpt")
    assert 20 / unstaged.step_s < bound / 1.5


def test_bad_requests() -> None:
    with pytest.raises(pm.ModelError, match="at least one PS"):
        pm.predict(_inputs(), 2, 0, "parameter_server")
    with pytest.raises(pm.ModelError, match="unknown variable update"):
        pm.predict(_inputs(), 2, 1, "horovod")


def test_recommendation_prefers_fewer_ps_within_one_percent() -> None:
    preds = [
        pm.Prediction(4, 4, "parameter_server", "lpt", 100.0, 1, "workers"),
        pm.Prediction(4, 2, "parameter_server", "lpt", 99.5, 1, "workers"),
        pm.Prediction(4, 1, "parameter_server", "lpt", 50.0, 1, "ps"),
        pm.Prediction(2, 1, "parameter_server", "round_robin", 40.0, 1, "workers"),
    ]
    best = pm.recommend(preds)
    assert best[4].ps == 2 and best[2].ps == 1
    grid = pm.grid(_inputs(), [8], [1, 2, 4])
    assert len(grid) == 2 * 3 * 4 + 1
    assert pm.recommend(grid)[8].images_per_sec == max(p.images_per_sec for p in grid)


def test_link_from_netbench() -> None:
    rows = [
        {"src": "a", "dst": "b", "bytes": 1024, "median_s": 0.0002},
        {"src": "a", "dst": "b", "bytes": 16 * MB, "median_s": 0.0102},
        {"src": "a", "dst": "b", "bytes": 64 * MB, "median_s": 0.0402},
        {"src": "b", "dst": "a", "bytes": 1024, "median_s": 0.0004},
        {"src": "b", "dst": "a", "bytes": 16 * MB, "median_s": 0.0204},
        {"src": "b", "dst": "a", "bytes": 64 * MB, "median_s": 0.0804},
    ]
    link = pi.link_from_netbench({"sizes": [1024, 16 * MB, 64 * MB], "point_to_point": rows})
    assert link.latency_s == pytest.approx(0.0003)
    assert link.bandwidth == pytest.approx(statistics.median([48 * MB / 0.03, 48 * MB / 0.06]))
    with pytest.raises(pm.ModelError):
        pi.link_from_netbench({"sizes": [1024], "point_to_point": rows[:1]})


def test_cli_predicts_synchronous_ps_and_the_all_reduces_options(tmp_path) -> None:
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(_inputs().to_dict()))
    base = ["model", "--inputs", str(path), "--workers", "4", "--ps", "2", "--all"]

    def rates(*flags: str) -> dict[tuple[str, str], str]:
        out = CliRunner().invoke(cli, [*base, *flags])
        assert out.exit_code == 0, out.output
        rows = [line.split() for line in out.output.splitlines() if line.startswith("4 ")]
        return {(r[2], r[3]): r[4] for r in rows}

    inputs = _inputs()
    sync = rates("--sync", "--staged")
    expected = pm.predict(inputs, 4, 2, "parameter_server", "lpt", sync=True, staged=True)
    assert sync[("parameter_server", "lpt")] == f"{expected.images_per_sec:.1f}"
    ring = rates("--gradient-repacking", "4", "--compact-gradient-transfer")
    packed = pm.predict(inputs, 4, 0, "collective_all_reduce", packs=4, compact=True)
    assert ring[("collective_all_reduce", "-")] == f"{packed.images_per_sec:.1f}"
    plain = pm.predict(inputs, 4, 0, "collective_all_reduce").images_per_sec
    assert packed.images_per_sec > plain
    refused = CliRunner().invoke(cli, [*base, "--sync", "--overlap"])
    assert refused.exit_code == 2 and "ordered reads under the synchronous barrier" in (
        refused.output
    )


def test_inputs_round_trip_and_cli(tmp_path) -> None:
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(_inputs().to_dict()))
    assert pi.load_inputs(path) == _inputs()
    result = CliRunner().invoke(cli, ["model", "--inputs", str(path), "--workers", "1,8"])
    assert result.exit_code == 0, result.output
    assert "Assumptions:" in result.output and "Recommended per worker count:" in result.output
    assert "latency 1000 µs, bandwidth 100 MB/s, a NIC per host" in result.output
    rows = {}
    for flag in ((), ("--staged",), ("--overlap",)):
        args = ["model", "--inputs", str(path), "--workers", "2", "--ps", "1", "--all", *flag]
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 0, out.output
        rows[flag] = out.output
    inputs = _inputs()
    staged = pm.predict(inputs, 2, 1, "parameter_server", staged=True).images_per_sec
    replicated = pm.predict(inputs, 2, 1, "distributed_replicated").images_per_sec
    assert staged > pm.predict(inputs, 2, 1, "parameter_server").images_per_sec
    # --staged stages parameter_server alone; distributed_replicated keeps its figure
    assert f"parameter_server        round_robin  {staged:.1f}" in rows[("--staged",)]
    assert f"distributed_replicated  round_robin  {replicated:.1f}" in rows[("--staged",)]
    assert f"parameter_server        round_robin  {staged:.1f}" not in rows[("--overlap",)]
    missing = CliRunner().invoke(cli, ["model"])
    assert missing.exit_code == 2 and "--compute-img-s" in missing.output
    (tmp_path / "bad.json").write_text("{}")
    bad = CliRunner().invoke(cli, ["model", "--inputs", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "incomplete" in bad.output


def test_prediction_beside_measurement() -> None:
    inputs = _inputs()
    measured = pm.predict(inputs, 2, 1, "parameter_server").images_per_sec * 1.25
    rows = [
        Row(Point(2, 1, "parameter_server", False), measured, None, 1, 0),
        Row(Point(4, 1, "parameter_server", False), None, None, 1, 1),  # failed: left out
    ]
    lines, median = measured_lines(inputs, rows, "round_robin")
    assert median == pytest.approx(20.0)  # predicted / measured = 0.8
    assert lines[1].split()[-1] == "-20.0"
    assert lines[-1] == "median absolute error: 20.0 % over 1 rows"


def test_measured_compute_contention_replaces_the_lone_workers_compute() -> None:
    # Lone: 0.5 s; 4 lone workers at once: 0.7 s each; 2 interpolates, 8 extrapolates.
    inputs = _inputs(compute_at=((4, 0.7),))
    assert inputs.compute_with(1) == 0.5 and inputs.compute_with(4) == pytest.approx(0.7)
    assert inputs.compute_with(2) == pytest.approx(0.5 + 0.2 / 3)
    assert inputs.compute_with(8) == pytest.approx(0.7 + 0.2 / 3 * 4)
    slow = pm.predict(inputs, 4, 0, "collective_all_reduce")
    assert slow.step_s == pytest.approx(
        pm.predict(_inputs(), 4, 0, "collective_all_reduce").step_s + 0.2
    )
    assert pm.Inputs.from_dict(json.loads(json.dumps(inputs.to_dict()))) == inputs


def test_cli_takes_compute_contention_and_refuses_a_bad_one(tmp_path) -> None:
    bad = CliRunner().invoke(
        cli,
        ["model", "--netbench", str(tmp_path), "--compute-img-s", "10", "--compute-img-s-at", "8"],
    )
    assert bad.exit_code == 2 and "W=IMG_S" in bad.output


# --- assumptions 9-11: gRPC's CPU, a loaded PS, synchronous PS, the ring's CPU, packs, fp16 -----


def test_synchronous_ps_moves_every_workers_bytes_through_the_fullest_ps() -> None:
    # 2 PS, LPT: 4 MB | 4 MB (v0 alone; v1, v2, v3 together). 4 workers, 100 MB/s, own NIC 8 MB.
    inputs = _inputs()
    sync = pm.predict(inputs, 4, 2, "parameter_server", "lpt", sync=True)
    phase = max(8 * MB / LINK.bandwidth, 4 * 4 * MB / LINK.bandwidth)  # 0.16 s: the PS links
    step = 0.5 + 2 * LINK.latency_s + 2 * phase
    assert sync.step_s == pytest.approx(step)
    assert sync.images_per_sec == pytest.approx(4 * 32 / step)
    assert sync.bound == "ps"
    # staged: the next pull beside this step's compute and push
    staged = pm.predict(inputs, 4, 2, "parameter_server", "lpt", overlap=True, sync=True)
    first = pm.first_bucket_s(LINK, 4 * MB, 8)
    assert staged.step_s == pytest.approx(max(0.5, phase) + 2 * LINK.latency_s + first)
    # where the PS's link binds, the pull runs beside the push only in part (the barrier: a
    # variable's new value leaves once every worker's gradient for it is in)
    quick = pm.predict(
        _inputs(compute_s=0.05), 4, 2, "parameter_server", "lpt", staged=True, sync=True
    )
    bound = (2 - pm.SYNC_STAGED_OVERLAP) * phase
    assert quick.step_s == pytest.approx(bound + 2 * LINK.latency_s + first)
    assert phase < quick.step_s < 2 * phase
    # a loaded PS that moves only 100 MB/s in and out together binds harder than its link
    slow = pm.predict(_inputs(ps_bytes_per_s=100 * MB), 4, 2, "parameter_server", "lpt", sync=True)
    assert slow.step_s == pytest.approx(0.5 + 2 * LINK.latency_s + 2 * (2 * 4 * 4 * MB / 100e6))
    # asynchronous stays as it was (the default)
    assert pm.predict(inputs, 4, 2, "parameter_server", "lpt") == pm.predict(
        inputs, 4, 2, "parameter_server", "lpt", sync=False
    )


def test_grpc_cpu_per_byte_adds_to_a_workers_cpu_on_its_own_cores() -> None:
    # 8 MB pulled and pushed at 10 ns/B on 2 cores: 2 x 8 MB x 10 ns / 2 = 0.08 s more CPU
    inputs = _inputs(cpu_s_per_byte=10e-9, cores_per_host=2)
    assert pm.worker_cpu_s(inputs, 1) == pytest.approx(0.58)
    assert pm.worker_cpu_s(_inputs(cpu_s_per_byte=10e-9), 1) == 0.5  # cores not modelled
    sync = pm.predict(inputs, 1, 1, "parameter_server", sync=True)
    assert sync.step_s == pytest.approx(0.58 + 2 * LINK.latency_s + 2 * 0.08)


def test_ring_cpu_per_byte_packs_and_float16() -> None:
    w = 4
    moved = 2 * (w - 1) / w * 8 * MB  # 12 MB each way
    link_s = moved / LINK.bandwidth + 2 * (w - 1) * LINK.latency_s
    inputs = _inputs(ring_cpu_s_per_byte=5e-9)
    ring = pm.predict(inputs, w, 0, "collective_all_reduce")
    assert ring.step_s == pytest.approx(0.5 + link_s + moved * 5e-9)  # no per-variable term
    compact = pm.predict(inputs, w, 0, "collective_all_reduce", compact=True)
    half_link = moved / 2 / LINK.bandwidth + 2 * (w - 1) * LINK.latency_s
    assert compact.step_s == pytest.approx(0.5 + half_link + moved / 2 * 5e-9)
    # 4 packs: the link part of the first three overlaps the backward pass
    packed = pm.predict(inputs, w, 0, "collective_all_reduce", packs=4)
    assert packed.step_s == pytest.approx(ring.step_s - link_s * 3 / 4)
    # without the ring's CPU term the per-variable round trips of assumption 5 stay
    assert pm.predict(_inputs(), w, 0, "collective_all_reduce").step_s == pytest.approx(
        0.5 + link_s + 2 * LINK.latency_s * len(VARS)
    )


def test_new_inputs_round_trip_and_old_files_still_load() -> None:
    inputs = _inputs(
        cpu_s_per_byte=1e-9, cores_per_host=3, ps_bytes_per_s=2e9, ring_cpu_s_per_byte=7e-9
    )
    assert pm.Inputs.from_dict(json.loads(json.dumps(inputs.to_dict()))) == inputs
    old = {k: v for k, v in _inputs().to_dict().items() if k in ("compute_s", "batch_size")}
    old.update(variable_bytes=[list(v) for v in VARS], link={"latency_s": 0.001, "bandwidth": 1e8})
    assert pm.Inputs.from_dict(old).ring_cpu_s_per_byte == 0.0
