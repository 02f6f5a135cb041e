"""benchmarks/tune_vs_sweep.py's pure parts: the cases it accepts per backend, tune's pick
among the swept settings, the budget, and the table (what counts as within 5 % and as at most
1/5 of the sweep's time)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from tflaunch.tools import tune_settings as ts

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("tune_vs_sweep", ROOT / "benchmarks/tune_vs_sweep.py")
tvs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tvs)

PS, CAR = "parameter_server", "collective_all_reduce"


def test_cases_per_backend() -> None:
    assert tvs.parse_cases("8:loopback:inception3,16:loopback:mnist", "local") == [
        (8, "loopback", "inception3"),
        (16, "loopback", "mnist"),
    ]
    assert tvs.parse_cases("2:1gbit:resnet50", "ssh") == [(2, "1gbit", "resnet50")]
    with pytest.raises(ValueError, match="RATE is loopback"):
        tvs.parse_cases("8:1gbit:inception3", "local")
    with pytest.raises(ValueError, match="give a rate"):
        tvs.parse_cases("8:loopback:inception3", "ssh")
    for bad in ("8:1gbit", "x:1gbit:mnist", "0:1gbit:mnist"):
        with pytest.raises(ValueError, match="W:RATE:MODEL"):
            tvs.parse_cases(bad, "ssh")
    assert tvs.parse_cases("4:loopback:inception3@32", "local") == [
        (4, "loopback", "inception3@32")
    ]
    assert tvs.model_batch("inception3@32", 2) == ("inception3", 32)
    assert tvs.model_batch("resnet50", 2) == ("resnet50", 2)
    for bad in ("4:1gbit:inception3@x", "4:1gbit:inception3@0", "4:1gbit:@8"):
        with pytest.raises(ValueError, match="NETWORK@BATCH"):
            tvs.parse_cases(bad, "ssh")


def test_the_pick_is_tune_json_s_after_verify() -> None:
    settings = [
        ts.Setting(1, PS),
        ts.Setting(1, PS, transfer="staged"),
        ts.Setting(0, CAR, "-", "none", "-"),
    ]
    assert tvs.pick_index({"pick": None}, settings) == 0
    assert tvs.pick_index({}, settings) == 0
    assert tvs.pick_index({"pick": settings[1].to_dict()}, settings) == 1


def test_the_budget_stops_before_a_new_run() -> None:
    tvs.Budget(0).check()  # no limit
    spent = tvs.Budget(0.01)
    time.sleep(0.02)
    with pytest.raises(tvs.OutOfBudget):
        spent.check()


def test_a_point_s_figure_is_its_runs_mean_and_none_if_one_failed() -> None:
    assert tvs.mean_rate([5.0]) == 5.0
    assert tvs.mean_rate([5.0, 6.0, 7.3]) == 6.1
    assert tvs.mean_rate([5.0, None]) is None
    assert tvs.mean_rate([]) is None


def _point(setting: ts.Setting, measured: float | None, seconds: float) -> dict:
    return {**setting.to_dict(), "predicted": 1.0, "measured": measured, "seconds": seconds}


def _case(workers: int, pick: int, rates: list, tune_s: float, verify: int = 0) -> dict:
    settings = [ts.Setting(p, PS) for p in range(1, len(rates) + 1)]
    sweep = [_point(s, r, 50.0) for s, r in zip(settings, rates, strict=True)]
    return {
        "case": f"w{workers}-loopback-inception3",
        "workers": workers,
        "rate": "loopback",
        "model": "inception3",
        "verify": verify,
        "tune_s": tune_s,
        "sweep_s": 50.0 * len(rates),
        "full_grid_points": 2 * len(rates),
        "pick": pick,
        "sweep": sweep,
    }


def test_the_table_counts_picks_within_5_percent_and_time_ratios() -> None:
    results = [
        _case(4, 0, [10.0, 9.0, 8.0, 7.0, 6.0], 40.0),  # the best: 100 %, 0.16
        _case(8, 1, [10.0, 9.6, 8.0, 7.0, 6.0], 60.0, verify=2),  # 96 %, 0.24
        _case(16, 2, [10.0, 9.6, 8.0, None, 6.0], 30.0),  # 80 %, a failed point
        _case(16, 0, [None, 10.0, 8.0, 7.0, 6.0], 20.0),  # the pick failed
    ]
    results[3]["model"] = "inception3@32"
    for point in results[1]["sweep"]:  # --repeats 2: a point's figure is the mean of its runs
        point["runs"] = [point["measured"], point["measured"]]
    lines = tvs.table_lines(results)
    rows = [line for line in lines if line.startswith("| ") and "workers" in line]
    assert len(rows) == 4
    assert "| 4 workers, loopback, inception3 | 5/5 |" in rows[0] and "| 100 % |" in rows[0]
    assert "| 5/5, 2 runs each |" in rows[1]
    assert "(verify 2)" in rows[1] and "| 96 % |" in rows[1] and "| 0.24 |" in rows[1]
    assert "| 4/5 |" in rows[2] and "| 80 % |" in rows[2] and "(model)" in rows[2]
    assert (
        "| failed | - |" in rows[3] and "| 16 workers, loopback, inception3 batch 32 |" in rows[3]
    )
    summary = "\n".join(lines)
    assert "within 5 % of the sweep's best in 2 of 4 settings" in summary
    assert "at most 1/5 of the sweep's in 3 of 4" in summary
    # the full grid: twice the points, the sweep's time estimated from the measured points'
    assert "| 10, 500, 0.08 |" in rows[0]
    # each case's run-to-run spread: the sweep's repeated points, the verify race's runs
    results[1]["sweep"][0]["runs"] = [9.0, 11.0]
    results[2]["verify_spread"] = 0.05
    spread = next(line for line in tvs.table_lines(results) if line.startswith("run-to-run"))
    assert f"{results[1]['case']} sweep 0.0 %" in spread  # the median over five points
    assert f"{results[2]['case']} verify 5.0 %" in spread
    document = {"ranked": [{"verify": {"runs": [9.0, 11.0]}}, {"verify": {"runs": [10.0]}}, {}]}
    assert tvs.verify_spread(document) == pytest.approx(2**0.5 / 10)


def test_a_setting_verify_and_the_sweep_both_ran_gives_a_spread() -> None:
    case = _case(4, 0, [10.0, 9.0, 8.0, 7.0, 6.0], 40.0, verify=2)
    case["sweep"][0]["verified"] = 11.0  # verify's run of the pick: 11 against the sweep's 10
    case["sweep"][1]["verified"] = 9.0  # the second: the same figure twice
    text = tvs.spread_text(case)
    assert text == "verify vs sweep run of one setting 9.5, 0.0 %"  # |11 - 10| / 10.5


def test_the_ssh_python_carries_the_callers_pythonpath(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    script = Path(tvs.ssh_python(tmp_path)).read_text()
    assert f"PYTHONPATH={tvs.ROOT}:/carried/site exec " in script
    monkeypatch.delenv("PYTHONPATH")
    script = Path(tvs.ssh_python(tmp_path)).read_text()  # the checkout alone, as the tests run it
    assert f"PYTHONPATH={tvs.ROOT} exec " in script
