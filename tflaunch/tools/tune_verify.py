"""``tflaunch tune --verify K``: a race between the model's top K settings that decides.

Runs of one setting differ by more than the model's margin on a shared machine (two runs of one
point by up to 29 %, a second pass 4-25 % lower than the first), so one short run each cannot
order two settings. The race:

- interleaves the settings' runs, round by round (A B A B ...), so that the machine's drift
  falls on all of them alike;
- times enough steps a run to beat the step-to-step spread calibration measured
  (:func:`steps_for`);
- after each round from the second, gives every setting an interval (its mean images/sec, ``t``
  times the run-to-run spread over the root of its runs; the spread pooled over all settings'
  runs, as the machine's noise is the same for each) and drops a setting whose interval lies
  wholly below the leader's (successive halving);
- stops once one setting is left, after ``rounds`` rounds, or when the next round would pass
  the time budget;
- reports each setting's runs and spread; settings still within noise of the leader are said to
  be, and the simplest of them is chosen.

Nothing here runs anything: the runs are a function handed in (:class:`Race`'s ``measure``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tflaunch.tools import tune_settings as ts
from tflaunch.tools.tune_settings import Ranked

# Two-sided 90 % Student t quantiles by degrees of freedom (beyond: the normal's 1.645).
T90 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
       9: 1.833, 10: 1.812, 12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}  # fmt: skip
# The precision a run's mean step aims at (relative standard error), against the model's 5 %.
STEP_PRECISION = 0.025


def t90(df: int) -> float:
    """The two-sided 90 % t quantile for ``df`` degrees of freedom (the next smaller listed)."""
    if df < 1:
        return math.inf
    known = [d for d in T90 if d <= df]
    return T90[max(known)] if df <= 30 else 1.645


def relative_spread(values: Sequence[float]) -> float:
    """Standard deviation over mean (0 for fewer than two values)."""
    if len(values) < 2 or not statistics.fmean(values):
        return 0.0
    return statistics.stdev(values) / statistics.fmean(values)


def pooled_spread(runs: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The relative run-to-run spread pooled over several settings' runs (each setting's runs
    about its own mean), and its degrees of freedom."""
    squares, df = 0.0, 0
    for values in runs:
        if len(values) > 1:
            squares += relative_spread(values) ** 2 * (len(values) - 1)
            df += len(values) - 1
    return (math.sqrt(squares / df) if df else 0.0), df


def steps_for(step_times: Sequence[float], least: int, most: int) -> int:
    """Timed steps a run needs for its mean step to be within :data:`STEP_PRECISION` (one
    standard error) given the step-to-step spread of ``step_times``; within [least, most]."""
    spread = relative_spread(step_times)
    needed = math.ceil((spread / STEP_PRECISION) ** 2) if spread else least
    return max(least, min(most, needed))


@dataclass
class Entry:
    """One setting in the race: its runs' images/sec (None: the run failed)."""

    row: Ranked
    runs: list[float] = field(default_factory=list)
    failed: int = 0
    dropped_after: int = 0  # the round it was dropped in (0: still racing)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.runs) if self.runs else 0.0


@dataclass(frozen=True)
class Outcome:
    """The race's result: every entry (in the order given), the order runs were made in, the
    pooled run-to-run spread, the pick, and what to say."""

    entries: tuple[Entry, ...]
    order: tuple[int, ...]  # the index of each run's setting, in the order they ran
    spread: float
    pick: Entry
    within_noise: tuple[Entry, ...]  # the pick and the settings it could not be told from
    lines: tuple[str, ...]


class Race:
    """Interleaved rounds of the settings' runs until their intervals separate, ``rounds``
    rounds are done or ``budget_s`` seconds would be passed."""

    def __init__(
        self,
        rows: Sequence[Ranked],
        measure: Callable[[Ranked, int], float | None],
        rounds: int = 3,
        budget_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entries = [Entry(r) for r in rows]
        self.measure, self.rounds, self.budget_s, self.clock = measure, rounds, budget_s, clock
        self.order: list[int] = []

    def run(self) -> Outcome:
        started = self.clock()
        for round_no in range(1, max(1, self.rounds) + 1):
            live = [i for i, e in enumerate(self.entries) if not e.dropped_after]
            if len(live) < 2 and round_no > 1:
                break
            if round_no > 1 and self.budget_s:
                spent = self.clock() - started
                if spent / (round_no - 1) + spent > self.budget_s:  # the next round would pass it
                    break
            for i in live:
                self.order.append(i)
                value = self.measure(self.entries[i].row, round_no)
                if value is None:
                    self.entries[i].failed += 1
                else:
                    self.entries[i].runs.append(value)
            self.drop_separated(round_no)
        return self.outcome()

    def pooled_spread(self) -> tuple[float, int]:
        return pooled_spread([e.runs for e in self.entries])

    def interval(self, entry: Entry) -> tuple[float, float]:
        """The entry's 90 % interval of its mean (infinite before the spread is known)."""
        spread, df = self.pooled_spread()
        if not entry.runs or df < 1:
            return -math.inf, math.inf
        half = t90(df) * spread * entry.mean / math.sqrt(len(entry.runs))
        return entry.mean - half, entry.mean + half

    def drop_separated(self, round_no: int) -> None:
        live = [e for e in self.entries if not e.dropped_after]
        measured = [e for e in live if e.runs]
        for e in live:
            if not e.runs and e.failed:
                e.dropped_after = round_no  # it does not run: out
        if len(measured) < 2:
            return
        leader = max(measured, key=lambda e: e.mean)
        low = self.interval(leader)[0]
        for e in measured:
            if e is not leader and self.interval(e)[1] < low:
                e.dropped_after = round_no

    def outcome(self) -> Outcome:
        spread, df = self.pooled_spread()
        measured = [e for e in self.entries if e.runs]
        lines = []
        for e in self.entries:
            lines.append(self.entry_line(e))
        if not measured:
            pick = self.entries[0]
            lines.append("no verified setting produced a figure; keeping the model's pick")
            return Outcome(tuple(self.entries), tuple(self.order), spread, pick, (), tuple(lines))
        racing = [e for e in measured if not e.dropped_after] or measured
        leader = max(racing, key=lambda e: e.mean)
        low = self.interval(leader)[0]
        close = [e for e in racing if self.interval(e)[1] >= low]
        pick = min(close, key=lambda e: ts.simplicity(e.row.setting)) if close else leader
        if df < 1 and len(racing) > 1:  # one run each: no spread to call anything noise
            pick, close = leader, [leader]
            lines.append(
                "one run a setting: their spread is not known, so the order may be noise "
                "(--verify-rounds 2 or more measures it)"
            )
        if len(close) > 1:
            lines.append(
                "within noise: "
                + ", ".join(e.row.setting.label for e in close)
                + f" (run-to-run spread {100 * spread:.1f} %); choosing the simplest, "
                + pick.row.setting.label
            )
        else:
            lines.append(f"measured best: {pick.row.setting.label}, {pick.mean:.2f} img/s")
        order = "".join(chr(ord("A") + i) if i < 26 else "?" for i in self.order)
        lines.append(f"runs in the order {' '.join(order)}; pooled spread {100 * spread:.1f} %")
        return Outcome(
            tuple(self.entries), tuple(self.order), spread, pick, tuple(close), tuple(lines)
        )

    def entry_line(self, e: Entry) -> str:
        runs = ", ".join(f"{v:.2f}" for v in e.runs) or "none"
        lo, hi = self.interval(e)
        shown = f"{lo:.2f}-{hi:.2f}" if math.isfinite(lo) else "unknown"
        state = f"dropped after round {e.dropped_after}" if e.dropped_after else "racing"
        return (
            f"{e.row.setting.label}: runs {runs}; mean {e.mean:.2f}, spread "
            f"{100 * relative_spread(e.runs):.1f} %, 90 % interval {shown}; {state}"
            + (f"; {e.failed} run(s) failed" if e.failed else "")
        )
