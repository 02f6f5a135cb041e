"""tflaunch bench: sweep file checks, grid, aggregation, tables, CSV/JSON/plots (pure), and one
tiny real sweep through the local backend (slow)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

from tflaunch.errors import ConfigError
from tflaunch.tools.bench_results import (
    Measurement,
    Point,
    Row,
    aggregate,
    best_rows,
    best_table,
    efficiency,
    io_overhead,
    table,
)
from tflaunch.tools.bench_sweep import (
    grid,
    parse_sweep,
    parse_total,
    point_argv,
    run_sweep,
    write_outputs,
)

ROOT = Path(__file__).resolve().parent.parent


def _sweep(tmp_path: Path, **data):
    base = {"cluster": "c.yaml", "workers": [1, 2], "repeats": 2}
    return parse_sweep({**base, **data}, tmp_path / "sweep.yaml")


def test_defaults_and_paths(tmp_path) -> None:
    sweep = _sweep(tmp_path)
    assert sweep.cluster == tmp_path / "c.yaml"
    assert sweep.output_dir == tmp_path / "bench-sweep"
    assert (sweep.ps, sweep.variable_updates, sweep.data) == (
        None,
        ("parameter_server",),
        ("synthetic",),
    )
    assert parse_sweep({"cluster": "c", "workers": 1}, tmp_path / "s.yaml").repeats == 5


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"workerz": [1]}, "workerz: unknown key"),
        ({"workers": [0, 1]}, "workers: expected a list of whole numbers"),
        ({"ps": ["two"]}, "ps: expected a list"),
        ({"variable_updates": ["horovod"]}, "'horovod' is not one of parameter_server"),
        ({"data": ["real"]}, "data_dir: 'data: [real]' needs data_dir"),
        ({"repeats": 0}, "repeats: expected a whole number of at least 1"),
    ],
)
def test_bad_sweep_files(tmp_path, data, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _sweep(tmp_path, **data)


def test_grid_ps_up_to_workers_and_collective_without_ps(tmp_path) -> None:
    sweep = _sweep(
        tmp_path,
        workers=[1, 2],
        variable_updates=["parameter_server", "collective_all_reduce"],
        data=["synthetic", "real"],
        data_dir="d",
    )
    points = grid(sweep)
    ps_points = [(p.workers, p.ps, p.real_data) for p in points if p.ps]
    assert ps_points == [
        (1, 1, False),
        (1, 1, True),
        (2, 1, False),
        (2, 2, False),
        (2, 1, True),
        (2, 2, True),
    ]
    collective = [(p.workers, p.ps) for p in points if p.variable_update == "collective_all_reduce"]
    assert collective == [(1, 0), (1, 0), (2, 0), (2, 0)]
    # Listed PS counts above the worker count are skipped.
    assert {(p.workers, p.ps) for p in grid(_sweep(tmp_path, ps=[2, 4]))} == {(2, 2)}


def test_point_argv_adds_flags_and_refuses_reserved_ones() -> None:
    real = Point(2, 1, "distributed_replicated", True)
    assert point_argv(["prog"], real, Path("/d")) == (
        "prog",
        "--variable_update",
        "distributed_replicated",
        "--data_dir",
        "/d",
    )
    assert point_argv(["prog"], Point(1, 1, "parameter_server", False), None)[-1] == (
        "parameter_server"
    )
    with pytest.raises(ConfigError, match="already passes --data_dir"):
        point_argv(["prog", "--data_dir=/x"], real, Path("/d"))


def test_point_argv_checks_the_benchmark_model_against_the_registry() -> None:
    point = Point(1, 1, "parameter_server", False)
    bench = ["python3", "-m", "tflaunch.models.benchmark"]
    for model in (["--model", "inception3"], ["--model=resnet50"], ["--model", "inception_v3"]):
        assert point_argv([*bench, *model], point, None)[-1] == "parameter_server"
    with pytest.raises(ConfigError, match="unknown --model 'vgg16'; choose one of: inception3"):
        point_argv([*bench, "--model", "vgg16"], point, None)
    with pytest.raises(ConfigError, match="not a CNN the benchmark trains"):
        point_argv([*bench, "--model=mnist"], point, None)
    assert point_argv(["my_bench.py", "--model", "vgg16"], point, None)  # not ours: not checked


def test_parse_total_takes_worker_0_or_the_chief() -> None:
    out = "[worker:1] total images/sec: 5.00\n[worker:0] total images/sec: 12.34\n"
    assert parse_total(out) == 12.34
    assert parse_total("[chief:0]   total images/sec: 7.5\n") == 7.5  # prefixes are padded
    assert parse_total("[worker:0] images/sec: 3.0 +/- 0.1 (jitter = 0.0)\n") is None


def _measurements() -> list[Measurement]:
    values = {
        Point(1, 1, "parameter_server", False): [10.0, 12.0],
        Point(1, 1, "parameter_server", True): [8.0, 8.0],
        Point(2, 1, "parameter_server", False): [15.0, 17.0],
        Point(2, 2, "parameter_server", False): [20.0, None],
        Point(2, 1, "parameter_server", True): [12.0, 12.0],
        Point(2, 0, "collective_all_reduce", True): [None, None],
    }
    return [
        Measurement(p, r + 1, v, 0 if v is not None else 1, f"run{r}")
        for p, vs in values.items()
        for r, v in enumerate(vs)
    ]


def test_aggregate_best_efficiency_and_io_overhead() -> None:
    rows = aggregate(_measurements())
    by_point = {r.point: r for r in rows}
    assert by_point[Point(1, 1, "parameter_server", False)].mean == 11.0
    two_ps = by_point[Point(2, 2, "parameter_server", False)]
    assert (two_ps.mean, two_ps.stdev, two_ps.runs, two_ps.failed) == (20.0, None, 2, 1)
    assert by_point[Point(2, 0, "collective_all_reduce", True)].mean is None
    best = best_rows(rows)
    assert best[(False, 2)].point.ps == 2 and best[(True, 2)].mean == 12.0
    assert efficiency(best) == {
        (False, 1): 1.0,
        (True, 1): 1.0,
        (False, 2): pytest.approx(20 / 22),
        (True, 2): pytest.approx(12 / 16),
    }
    assert io_overhead(best) == {1: pytest.approx(3 / 11), 2: pytest.approx(0.4)}


def test_tables_have_the_cscs_columns() -> None:
    rows = aggregate(_measurements())
    text = table(rows)
    assert text.splitlines()[0].split() == [
        "Num",
        "PSs",
        "Num",
        "workers",
        "Variable",
        "Update",
        "Real",
        "Data",
        "Img/s",
    ]
    assert "failed (2/2 failed)" in text
    assert "(1/2 failed)" in text
    best = best_table(rows)
    assert "I/O overhead (synthetic - real) / synthetic: 1 workers 27.3 %, 2 workers 40.0 %" in best
    assert "90.9 %" in best  # synthetic efficiency at 2 workers


def test_run_sweep_is_repeat_major_with_progress(tmp_path) -> None:
    sweep = _sweep(tmp_path, workers=[1])
    calls: list[tuple[Point, int]] = []
    lines: list[str] = []

    def runner(point: Point, repeat: int) -> Measurement:
        calls.append((point, repeat))
        return Measurement(point, repeat, 1.5, 0, "r")

    points = [Point(1, 1, "parameter_server", False), Point(1, 1, "parameter_server", True)]
    run_sweep(sweep, runner, points, lines.append)
    assert [r for _, r in calls] == [1, 1, 2, 2]
    assert lines[0].startswith("[1/4] 1 workers, 1 PS, parameter_server, synthetic, repeat 1/2")
    assert "1.50 img/s" in lines[1] and "left)" in lines[1]


def test_an_interrupted_sweep_keeps_the_finished_runs(tmp_path) -> None:
    from tflaunch.tools.bench_sweep import SweepInterrupted

    sweep = _sweep(tmp_path, workers=[1])
    done: list[Measurement] = []

    def runner(point: Point, repeat: int) -> Measurement:
        if repeat == 2:
            raise SweepInterrupted(130)
        return Measurement(point, repeat, 2.0, 0, "r")

    with pytest.raises(SweepInterrupted):
        run_sweep(sweep, runner, [Point(1, 1, "parameter_server", False)], lambda _: None, done)
    assert [m.repeat for m in done] == [1]


def test_outputs_csv_json_and_pngs(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    sweep = _sweep(tmp_path, output_dir="out")
    paths = write_outputs(sweep, _measurements())
    assert [p.name for p in paths] == [
        "results.csv",
        "results.json",
        "images_per_sec.png",
        "efficiency.png",
    ]
    with (tmp_path / "out" / "results.csv").open() as f:
        records = list(csv.DictReader(f))
    assert len(records) == 6
    best = [r for r in records if r["best"] == "True"]
    assert {(r["num_workers"], r["real_data"]) for r in best} == {
        ("1", "False"),
        ("1", "True"),
        ("2", "False"),
        ("2", "True"),
    }
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(document["measurements"]) == 12 and document["io_overhead"]["2"] == 0.4
    for png in paths[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_without_any_success_write_no_plots(tmp_path) -> None:
    from tflaunch.tools.bench_sweep_plot import plot_results

    assert (
        plot_results(
            [Row(Point(1, 1, "parameter_server", False), None, None, 1, 1)], {}, {}, tmp_path, "t"
        )
        == []
    )


# --- a real sweep (slow) -----------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_sweep_through_the_local_backend(tmp_path) -> None:
    """The sweep's runs, aggregation and outputs are tflaunch's: the stand-in task prints the
    benchmark's last line (``total images/sec``) where tflaunch.models.benchmark would train
    (its variable updates run for real in test_benchmark and test_transfers)."""
    from tests.helpers import FAKE_TASK, tflaunch, wait_until_gone, write_cluster

    program = {
        "argv": [sys.executable, str(FAKE_TASK)],
        "workdir": str(ROOT),
        "env": {"TEST_MARKER": str(tmp_path), "WORK_SECONDS": "0.2", "TOTAL_IMAGES_PER_SEC": "7"},
    }
    write_cluster(tmp_path / "cluster.yaml", program)
    sweep = {
        "cluster": "cluster.yaml",
        "workers": [1],
        "repeats": 1,
        "variable_updates": ["parameter_server", "collective_all_reduce"],
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    result = tflaunch("bench", str(tmp_path / "sweep.yaml"), cwd=ROOT, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[2/2]" in result.stdout and "FAILED" not in result.stdout
    assert "Best per worker count" in result.stdout
    out = tmp_path / "bench-sweep"
    for name in ("results.csv", "results.json", "images_per_sec.png", "efficiency.png"):
        assert (out / name).is_file(), name
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["point"]["variable_update"]: r["point"]["ps"] for r in rows} == {
        "parameter_server": 1,
        "collective_all_reduce": 0,
    }
    assert all(r["mean"] == pytest.approx(7.0) for r in rows)  # worker 0's line, each point
    assert wait_until_gone(str(tmp_path)) == []
