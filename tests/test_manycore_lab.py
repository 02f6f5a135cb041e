"""benchmarks/manycore_lab.py's and manycore_report.py's pure parts: a loaded PS's measured
capacity for a row's worker count (the fan-in netbench load nearest it, never extrapolated), and
the committed results' model errors as docs/performance.md quotes them."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("manycore_lab", ROOT / "benchmarks/manycore_lab.py")
lab = importlib.util.module_from_spec(spec)
sys.modules["manycore_lab"] = lab  # (its dataclasses look their module up)
spec.loader.exec_module(lab)

from benchmarks import manycore_report  # noqa: E402 (the lab put the checkout on the path)


def _ps_test(workers: int, steps_per_s: float) -> dict:
    """netbench's PS test: one PS of 100 bytes, every worker at ``steps_per_s``."""
    return {
        "ps": {"num_ps": 1, "num_workers": workers, "total_bytes": 100,
               "steps_per_s": [steps_per_s] * workers}
    }  # fmt: skip


def test_the_loaded_ps_is_the_measured_load_nearest_the_row():
    cal = {"netbench_unshaped": _ps_test(4, 10.0), "netbench_1gbit": {}}
    four = 4 * 10.0 * 100 * 2  # in and out together
    assert manycore_report.loaded_ps_rate(cal, 16) == four  # only 4 measured: no extrapolation
    cal["netbench_fanin_16"] = _ps_test(16, 5.0)
    sixteen = 16 * 5.0 * 100 * 2
    assert manycore_report.loaded_ps_rate(cal, 16) == sixteen
    assert manycore_report.loaded_ps_rate(cal, 2) == four
    assert manycore_report.loaded_ps_rate(cal, 32) == sixteen
    assert manycore_report.loaded_ps_rate(cal, 8) == pytest.approx(four + (sixteen - four) * 4 / 12)


@pytest.mark.parametrize(
    ("results", "medians"),
    [("manycore_lab.json", {"1gbit": 2.8, "10gbit": 24.2}),
     ("manycore_lab_3cores.json", {"1gbit": 2.5, "10gbit": 6.3}),
     ("manycore_lab_16cores.json", {"1gbit": 11.8})],
)  # fmt: skip
def test_the_committed_rounds_model_errors_are_the_documented_ones(results, medians, capsys):
    pytest.importorskip("tensorflow")  # the models' variables come from the registry
    store = json.loads((ROOT / "benchmarks/results" / results).read_text())

    manycore_report.report(None, store)
    out = capsys.readouterr().out
    for rate, median in medians.items():
        assert f"model at {rate}: median absolute error {median:.1f} %" in out


def test_link_limits_are_the_busiest_links_bytes():
    """A ring moves 2(W-1)/W of the gradients on each worker's link (half in float16); a PS
    setting's fullest PS moves W times its balanced share each way."""
    link = types.SimpleNamespace(bandwidth=100e6)
    inputs = types.SimpleNamespace(batch_size=2, model_bytes=100e6, link=link)
    ring = {"workers": 8, "ps": 0, "update": lab.CAR, "options": []}
    assert manycore_report.link_limit(inputs, ring) == pytest.approx(16 / 1.75)
    compact = {**ring, "options": ["--compact_gradient_transfer"]}
    assert manycore_report.link_limit(inputs, compact) == pytest.approx(16 / 0.875)
    xring = {**ring, "update": lab.DAR, "options": ["--all_reduce_spec=xring"]}
    assert manycore_report.link_limit(inputs, xring) == manycore_report.link_limit(inputs, ring)
    for update, opts in ((lab.PS, []), (lab.DR, []), (lab.DAR, ["--all_reduce_spec=pscpu"])):
        row = {"workers": 8, "ps": 2, "update": update, "options": opts}
        assert manycore_report.link_limit(inputs, row) == pytest.approx(
            16 / 4.0
        )  # 8 x 50 MB at 100 MB/s


def test_the_linklimit_grid_puts_the_buckets_first_and_every_peer_setting():
    grid = lab.linklimit_grid()
    assert grid[0].options == lab.BUCKETED and grid[0].workers == 8
    peer = {(pt.update, pt.options, pt.sync) for pt in grid if pt.side == "peer"}
    assert (lab.CAR, ("--all_reduce_spec=collective",), True) in peer
    assert {
        (lab.DAR, ("--all_reduce_spec=xring",), True),
        (lab.DAR, ("--all_reduce_spec=pscpu",), True),
    } <= peer
    assert {(lab.PS, (), s) for s in (True, False)} <= peer
    assert {(lab.PS, ("--staged_vars",), s) for s in (True, False)} <= peer
    assert {(lab.DR, (), s) for s in (True, False)} <= peer
    assert len({pt.key for pt in grid}) == len(grid)  # no row twice
