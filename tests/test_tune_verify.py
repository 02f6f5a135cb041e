"""tflaunch tune --verify's race (pure: the runs are injected measurements, nothing starts):
interleaved rounds, spreads, separation, the within-noise case, the budget, the steps a run."""

from __future__ import annotations

import pytest

from tflaunch.tools import tune_verify as tv
from tflaunch.tools.tune_settings import Ranked, Setting

PS, CAR = "parameter_server", "collective_all_reduce"


def _rows() -> list[Ranked]:
    # A: the model's first (2 PS, LPT, staged); B: simpler (1 PS); C: all-reduce
    return [
        Ranked(Setting(2, PS, "lpt", "staged"), 12.0, 1.0, "ps"),
        Ranked(Setting(1, PS), 11.0, 1.0, "ps"),
        Ranked(Setting(0, CAR, "-", "none", "-"), 10.0, 1.0, "ring"),
    ]


def _measurements(values: dict[str, list[float]]):
    """A measure() that hands out each setting's figures in turn, keyed by label's first word."""
    feeds = {key: iter(v) for key, v in values.items()}
    calls: list[str] = []

    def measure(row: Ranked, round_no: int) -> float | None:
        key = row.setting.label
        calls.append(key)
        return next(feeds[key])

    return measure, calls


def test_runs_are_interleaved_round_by_round_and_spreads_reported() -> None:
    a, b, c = (r.setting.label for r in _rows())
    measure, calls = _measurements(
        {a: [10.0, 10.5, 10.2], b: [10.1, 10.4, 10.3], c: [9.9, 10.6, 10.0]}
    )
    outcome = tv.Race(_rows(), measure, rounds=3).run()
    assert calls == [a, b, c] * 3  # A B C A B C A B C: drift falls on all alike
    assert outcome.order == (0, 1, 2) * 3
    spreads = {e.row.setting.label: tv.relative_spread(e.runs) for e in outcome.entries}
    assert spreads[a] == pytest.approx(0.2517 / 10.2333, rel=1e-3)
    pooled = (sum(s**2 for s in spreads.values()) / 3) ** 0.5  # two runs' freedom each
    assert outcome.spread == pytest.approx(pooled)
    assert any(f"spread {100 * spreads[b]:.1f} %" in line for line in outcome.lines)


def test_within_noise_says_so_and_chooses_the_simplest() -> None:
    rows = _rows()[:2]
    a, b = (r.setting.label for r in rows)
    measure, _ = _measurements({a: [10.3, 9.8, 10.4], b: [10.0, 10.2, 9.9]})
    outcome = tv.Race(rows, measure, rounds=3).run()
    assert {e.row.setting.label for e in outcome.within_noise} == {a, b}
    assert outcome.pick.row.setting.label == b  # 1 PS plain is simpler than 2 PS LPT staged
    assert any(line.startswith("within noise: ") and b in line for line in outcome.lines)


def test_separated_settings_stop_the_race_early() -> None:
    rows = _rows()[:2]
    a, b = (r.setting.label for r in rows)
    measure, calls = _measurements({a: [10.0, 10.2, 10.1], b: [6.0, 6.1, 6.2]})
    outcome = tv.Race(rows, measure, rounds=3).run()
    assert calls == [a, b, a, b]  # separated after the second round: no third
    dropped = next(e for e in outcome.entries if e.row.setting.label == b)
    assert dropped.dropped_after == 2 and outcome.pick.row.setting.label == a
    assert outcome.within_noise == (outcome.pick,)
    assert any(line.startswith("measured best: ") for line in outcome.lines)


def test_no_round_starts_that_would_pass_the_budget() -> None:
    now = [0.0]
    rows = _rows()[:2]
    a, b = (r.setting.label for r in rows)
    inner, calls = _measurements({a: [10.0, 10.5, 10.2], b: [10.1, 10.4, 10.3]})

    def measure(row: Ranked, round_no: int) -> float | None:
        now[0] += 10.0  # each run takes 10 s
        return inner(row, round_no)

    tv.Race(rows, measure, rounds=3, budget_s=35, clock=lambda: now[0]).run()
    assert calls == [a, b]  # round 1 took 20 s; a second would end at 40 s
    now[0] = 0.0
    inner, calls = _measurements({a: [10.0, 10.5, 10.2], b: [10.1, 10.4, 10.3]})
    tv.Race(rows, measure, rounds=3, budget_s=45, clock=lambda: now[0]).run()
    assert calls == [a, b, a, b]  # 40 s fit; a third round would end at 60 s


def test_a_setting_that_fails_is_dropped_and_the_other_picked() -> None:
    rows = _rows()[:2]
    calls = []

    def measure(row: Ranked, round_no: int) -> float | None:
        calls.append(row.setting.ps)
        return None if row.setting.ps == 2 else 9.0 + round_no / 10

    outcome = tv.Race(rows, measure, rounds=3).run()
    assert outcome.pick.row is rows[1] and calls[:2] == [2, 1]
    assert calls.count(2) == 1  # a setting that does not run is not run again
    assert any("1 run(s) failed" in line for line in outcome.lines)


def test_steps_a_run_beat_the_step_to_step_spread() -> None:
    steady = [1.0, 1.01, 0.99, 1.0]
    assert tv.steps_for(steady, 6, 24) == 6  # spread ~0.8 %: the fewest asked for
    noisy = [1.0, 1.2, 0.8, 1.1, 0.9]  # spread ~15.8 %: (0.158 / 0.025)^2 = 40 steps
    assert tv.steps_for(noisy, 6, 24) == 24
    assert tv.steps_for([1.0, 1.1, 0.95, 1.05], 2, 100) == 7  # 6.3 %: (0.063 / 0.025)^2 = 6.4
    assert tv.steps_for([], 6, 24) == 6


def test_one_round_picks_the_measured_best_and_says_its_spread_is_unknown() -> None:
    rows = _rows()[:2]
    a, b = (r.setting.label for r in rows)
    measure, calls = _measurements({a: [10.4], b: [10.0]})
    outcome = tv.Race(rows, measure, rounds=1).run()
    assert calls == [a, b] and outcome.pick.row.setting.label == a  # no spread: the faster
    assert any("spread is not known" in line for line in outcome.lines)
    assert not any(line.startswith("within noise") for line in outcome.lines)
