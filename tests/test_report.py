"""tflaunch report: series and totals from samples (pure), and a real run whose byte counts agree
with the interface counters read before and after it."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil

from tests.helpers import tflaunch, traffic_cluster, wait_until_gone
from tflaunch.tools.report import PLOTS, format_summary, net_steps, summary, usage_from_samples

MIB = 1024 * 1024


def counters(**nics: tuple[int, int, int, int]) -> dict:
    return {
        nic: dict(zip(("bytes_sent", "bytes_recv", "packets_sent", "packets_recv"), v, strict=True))
        for nic, v in nics.items()
    }


def sample(time: float, cpu: float | None, net: dict, tasks: dict) -> dict:
    return {
        "time": time,
        "node": {"cpu_percent": cpu, "mem_used": 100 * MIB, "net": net},
        "tasks": tasks,
    }


def test_net_steps_counts_new_and_recreated_interfaces_from_zero():
    before = counters(lo=(100, 100, 10, 10), veth0=(50, 60, 5, 6))
    after = counters(lo=(150, 170, 12, 15), veth0=(7, 8, 1, 1), br0=(30, 40, 3, 4))
    assert net_steps(before, after) == counters(
        lo=(50, 70, 2, 5), veth0=(7, 8, 1, 1), br0=(30, 40, 3, 4)
    )


def test_usage_and_summary_from_samples_exactly():
    hosts = {
        "a": [
            sample(100.0, None, counters(lo=(1000, 1000, 10, 10)), {}),
            sample(
                101.0,
                50.0,
                counters(lo=(3000, 3000, 30, 30)),
                {"worker:0": {"cpu_percent": 80.0, "rss": 10 * MIB, "threads": 4}},
            ),
            sample(
                102.0,
                70.0,
                counters(lo=(4000, 4000, 40, 40), eth0=(500, 0, 5, 0)),
                {"worker:0": {"cpu_percent": 120.0, "rss": 30 * MIB, "threads": 6}},
            ),
            sample(104.0, 30.0, counters(lo=(4000, 4000, 40, 40), eth0=(700, 100, 7, 1)), {}),
        ],
        "b": [
            sample(
                100.5,
                10.0,
                counters(lo=(0, 0, 0, 0)),
                {"ps:0": {"cpu_percent": None, "rss": 5 * MIB, "threads": 2}},
            ),
            sample(
                103.5,
                20.0,
                counters(lo=(900, 900, 9, 9)),
                {"ps:0": {"cpu_percent": 4.0, "rss": 7 * MIB, "threads": 3}},
            ),
        ],
    }
    usage = usage_from_samples(hosts)
    assert usage.start == 100.0 and usage.duration == 4.0 and usage.samples == 6
    a = usage.nodes["a"]
    assert a.cpu.seconds == [0.0, 1.0, 2.0, 4.0] and a.cpu.values == [None, 50.0, 70.0, 30.0]
    assert a.packets_sent_rate.seconds == [1.0, 2.0, 4.0]
    assert a.packets_sent_rate.values == [20.0, 15.0, 1.0]  # (10 + 5) / 1 s, then 2 / 2 s
    data = summary(usage)
    assert data["tasks"] == {
        "ps:0": {
            "host": "b",
            "cpu_percent_mean": 4.0,
            "cpu_percent_peak": 4.0,
            "rss_mean": 6 * MIB,
            "rss_peak": 7 * MIB,
            "threads_peak": 3,
        },
        "worker:0": {
            "host": "a",
            "cpu_percent_mean": 100.0,
            "cpu_percent_peak": 120.0,
            "rss_mean": 20 * MIB,
            "rss_peak": 30 * MIB,
            "threads_peak": 6,
        },
    }
    node_a = data["nodes"]["a"]
    assert (node_a["bytes_sent"], node_a["bytes_recv"]) == (3000 + 700, 3000 + 100)
    assert (node_a["packets_sent"], node_a["packets_recv"]) == (30 + 7, 30 + 1)
    assert node_a["interfaces"]["eth0"] == counters(e=(700, 100, 7, 1))["e"]
    assert node_a["cpu_percent_mean"] == 50.0 and node_a["cpu_percent_peak"] == 70.0
    assert data["nodes"]["b"]["bytes_sent"] == 900
    text = format_summary("r1", data)
    assert "run r1: 2 task(s) on 2 node(s), 6 samples over 4.0 s" in text
    assert text.index("ps:0") < text.index("worker:0")
    assert "a eth0: sent 700 B (7 packets), received 100 B (1 packets)" in text
    row = next(line for line in text.splitlines() if line.startswith("worker:0")).split()
    assert row == ["worker:0", "a", "100.0", "120.0", "20.0", "MiB", "30.0", "MiB", "6"]


def test_report_of_a_real_run_agrees_with_the_interface_counters(tmp_path):
    """Workers send a known number of bytes to the PS over loopback; the report's loopback bytes
    are at least those and at most what the kernel counted from before to after the run."""
    sent_per_worker = 8 * MIB
    cluster = traffic_cluster(
        tmp_path, sent_per_worker, ALLOC_MB="30", BURN_SECONDS="0.3", HOLD_SECONDS="0.5"
    )
    before = psutil.net_io_counters(pernic=True)
    result = tflaunch("up", str(cluster))
    after = psutil.net_io_counters(pernic=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    report = tflaunch("report", str(run))
    assert report.returncode == 0, report.stderr
    data = json.loads((run / "summary.json").read_text())
    assert report.stdout.startswith((run / "summary.txt").read_text())
    for host in ("node-a", "node-b"):  # both agents sample this machine's loopback
        lo = data["nodes"][host]["interfaces"]["lo"]
        for name in ("bytes_sent", "bytes_recv"):
            kernel = getattr(after["lo"], name) - getattr(before["lo"], name)
            assert 2 * sent_per_worker <= lo[name] <= kernel, (host, name, lo[name], kernel)
        assert (
            f"{host} lo: sent {lo['bytes_sent']} B ({lo['packets_sent']} packets)" in report.stdout
        )
        for nic, moved in data["nodes"][host]["interfaces"].items():
            if nic in before and nic in after and after[nic].bytes_sent >= before[nic].bytes_sent:
                assert moved["bytes_sent"] <= after[nic].bytes_sent - before[nic].bytes_sent
    assert set(data["tasks"]) == {"ps:0", "worker:0", "worker:1"}
    assert data["tasks"]["worker:1"]["rss_peak"] > 30 * MIB
    assert data["tasks"]["worker:0"]["cpu_percent_peak"] > 0
    import matplotlib.image

    for name in PLOTS:
        image = matplotlib.image.imread(run / name)
        assert image.shape[0] > 200 and image.shape[1] > 600, name
        assert str(run / name) in report.stdout
    assert wait_until_gone(str(tmp_path)) == []


def test_report_without_matplotlib_writes_the_summary_and_says_what_to_install(tmp_path):
    """matplotlib missing (a laptop without the plotting extra): shadowed by a package that fails."""
    cluster = traffic_cluster(tmp_path, 0, HOLD_SECONDS="1")  # sampled a few times
    assert tflaunch("up", str(cluster)).returncode == 0
    (run,) = (tmp_path / "runs").iterdir()
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    report = tflaunch("report", str(run), env={"PYTHONPATH": str(shadow.parent)})
    assert report.returncode == 2
    assert "the plots need matplotlib" in report.stderr and "Traceback" not in report.stderr
    assert "TASK" in report.stdout and "worker:1" in report.stdout  # the table came first
    assert (run / "summary.txt").exists() and not (run / PLOTS[0]).exists()


def test_cli_and_report_module_do_not_import_matplotlib():
    code = (
        "import sys, tflaunch.cli, tflaunch.tools.report, tflaunch.runtime.monitor; "
        "assert 'matplotlib' not in sys.modules and 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_of_an_unknown_run_is_bad_input(tmp_path):
    result = tflaunch("report", "nope", "--run-dir", str(tmp_path))
    assert result.returncode == 2 and "run 'nope' was not found" in result.stderr
