"""netbench: sizes, tables and plot from a result (pure), and a real loopback run (slow)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import tflaunch, wait_until_gone, write_cluster
from tflaunch.cli import cli
from tflaunch.models import registry
from tflaunch.tools import netbench_command as nb

ROOT = Path(__file__).resolve().parent.parent
K, M = 1024, 1024**2


def _result(hosts=("10.0.0.1", "10.0.0.2")) -> dict:
    rows = []
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            for size, seconds in ((K, 100e-6), (M, 1e-3), (64 * M, 0.5)):
                rows.append(
                    {
                        "src_host": a,
                        "dst_host": b,
                        "src": "/job:ps/task:0",
                        "dst": "/job:worker/task:0",
                        "bytes": size,
                        "median_s": seconds,
                        "min_s": seconds,
                        "repeats": 5,
                    }
                )
    ps = {
        "model": "inception_v3",
        "placement": "lpt",
        "num_ps": 2,
        "num_workers": 2,
        "bytes_per_ps": [50_000_000, 45_000_000],
        "total_bytes": 95_000_000,
        "num_variables": 190,
        "steps_per_s": [2.0, 3.0],
    }
    return {"hosts": list(hosts), "sizes": [K, M, 64 * M], "point_to_point": rows, "ps": ps}


def test_sizes() -> None:
    assert nb.parse_sizes("1K-64M") == [K * 4**i for i in range(9)]
    assert nb.parse_sizes("1K-3K") == [K, 3 * K]
    assert nb.parse_sizes("64M,1k,1M") == [K, M, 64 * M]
    assert nb.human_bytes(64 * M) == "64M" and nb.human_bytes(1536) == "1.5K"
    for bad in ("", "1X", "64M-1K", "-"):
        with pytest.raises(nb.NetbenchError):
            nb.parse_sizes(bad)


def test_placement_follows_the_cluster_program() -> None:
    assert nb.placement_of(["python3", "-m", "x", "--variable_placement", "lpt"]) == "lpt"
    assert nb.placement_of(["--variable_placement=greedy"]) == "greedy"
    assert nb.placement_of(["python3", "train.py"]) == "round_robin"


def test_report_has_the_latency_and_bandwidth_matrices_and_ps_throughput() -> None:
    lines = nb.report_lines(_result())
    text = "\n".join(lines)
    lat = lines.index(next(line for line in lines if line.startswith("latency")))
    assert lines[lat + 1].split() == ["10.0.0.1", "10.0.0.2"]
    assert lines[lat + 2].split() == ["10.0.0.1", "-", "100"]  # µs
    assert lines[lat + 3].split() == ["10.0.0.2", "100", "-"]
    bw = lines.index(next(line for line in lines if line.startswith("bandwidth")))
    assert lines[bw + 2].split() == ["10.0.0.1", "-", f"{64 * M / 0.5 / 1e6:.0f}"]
    assert "placed lpt on 2 PS" in text
    # Each PS moves what it holds twice (pull + push) per step of every worker: 5 steps/s.
    assert re.search(r"^0\s+50\.0\s+500$", text, re.M)
    assert re.search(r"^1\s+45\.0\s+450$", text, re.M)


def test_plot_and_result_parsing(tmp_path) -> None:
    png = nb.plot(_result(), tmp_path / "n.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    log = tmp_path / "worker-0.log"
    log.write_text("noise\n" + nb.RESULT_PREFIX + json.dumps({"hosts": []}) + "\n")
    assert nb.read_result(log) == {"hosts": []}
    log.write_text("nothing\n")
    with pytest.raises(nb.NetbenchError, match="no result"):
        nb.read_result(log)


def test_bad_sizes_exit_2_before_anything_starts(tmp_path) -> None:
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "-c", "pass"]})
    result = CliRunner().invoke(cli, ["netbench", str(cluster), "--sizes", "lots"])
    assert result.exit_code == 2 and "not a message size" in result.output
    assert not (tmp_path / "runs").exists()


def test_ps_models_come_from_the_registry(tmp_path, monkeypatch) -> None:
    assert (*registry.model_names(sized_in_graph=True, aliases=True), "none") == nb.PS_MODELS
    assert {"inception_v3", "inception3", "resnet50", "mnist", "none"} <= set(nb.PS_MODELS)
    unsized = registry.ModelSpec("blob", "no graph build", "m:f", 8, 8, 2, sized_in_graph=False)
    monkeypatch.setitem(registry.MODELS, "blob", unsized)
    assert "blob" in registry.model_names() and "blob" not in registry.model_names(
        sized_in_graph=True, aliases=True
    )
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": [sys.executable, "-c", "pass"]})
    result = CliRunner().invoke(cli, ["netbench", str(cluster), "--ps-model", "vgg16"])
    assert result.exit_code == 2 and "'vgg16' is not one of" in result.output
    assert not (tmp_path / "runs").exists()


# find_spec, not importorskip: TensorFlow runs in the tasks; importing it here cost 4 s of CPU.
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")
def test_loopback_matrix_and_ps_throughput(tmp_path) -> None:
    program = {"argv": [sys.executable, "-c", "pass"], "env": {"TEST_MARKER": str(tmp_path)}}
    cluster = write_cluster(tmp_path / "c.yaml", program, supervision={"ready_timeout": 240})
    args = ["netbench", str(cluster), "--sizes", "1K,64K", "--ps-model", "mnist"]
    result = tflaunch(*args, "--max-seconds", "0.05", "--ps-steps", "3", cwd=ROOT, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"^127\.0\.0\.1\s+\d+$", out, re.M), out[-2000:]  # the 1x1 latency matrix
    assert re.search(
        r"^127\.0\.0\.1 ps:0\s+127\.0\.0\.1 worker:0\s+[\d.]+/\d+\s+[\d.]+/\d+$", out, re.M
    )
    assert "PS throughput: 2 worker(s)" in out and "round_robin on 1 PS" in out
    run = next((tmp_path / "runs").iterdir())
    data = json.loads((run / "netbench.json").read_text())
    assert [r["bytes"] for r in data["point_to_point"]] == [K, 64 * K]
    assert len(data["ps"]["steps_per_s"]) == 2 and min(data["ps"]["steps_per_s"]) > 0
    assert (run / "netbench.png").exists()
    assert wait_until_gone(str(tmp_path)) == []
