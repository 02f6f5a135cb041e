"""The performance model's inputs from measurements and files: the link from a netbench result
(or ``--link``), the compute per step from a lone worker's images/sec or a traced run, the model's
variables, and saved inputs (``tflaunch model --save``/``--inputs``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path

from tflaunch.tools.perfmodel import Inputs, Link, ModelError


def link_from_netbench(result: Mapping) -> Link:
    """Latency: median over pairs of the smallest message's time. Bandwidth: median over pairs
    of the slope between the two largest sizes (bytes per extra second)."""
    rows = result.get("point_to_point") or []
    sizes = sorted(result.get("sizes") or [])
    if not rows or len(sizes) < 2:
        raise ModelError("netbench result needs point-to-point rows at two sizes at least.")
    by_pair: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        by_pair.setdefault((r["src"], r["dst"]), {})[r["bytes"]] = r["median_s"]
    small, big2, big = sizes[0], sizes[-2], sizes[-1]
    latencies = [t[small] for t in by_pair.values() if small in t]
    slopes = []
    for t in by_pair.values():
        if big in t and big2 in t:
            dt = t[big] - t[big2]
            slopes.append((big - big2) / dt if dt > 0 else big / t[big])
    if not latencies or not slopes:
        raise ModelError("netbench result lacks the smallest or the two largest sizes.")
    return Link(statistics.median(latencies), statistics.median(slopes))


def compute_from_single(images_per_sec: float, batch_size: int) -> float:
    """A lone worker's (no cluster) step time."""
    if images_per_sec <= 0:
        raise ModelError("the single-worker images/sec must be positive.")
    return batch_size / images_per_sec


def compute_from_trace(trace_dir: Path) -> tuple[float, str, int]:
    """A lone worker's step time without its communication, from the trace of a traced
    one-worker run (``tflaunch up --trace``, any program): the step's wall time less the time
    it spent only sending, receiving or waiting on a receive (compute and the program's own
    idle time stay in). Returns (seconds, the worker, traced steps)."""
    path = trace_dir / "trace_summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"no trace summary at {path}: run one worker with 'tflaunch up CLUSTER --trace "
            "STEPS' first (or 'tflaunch trace RUN' if trace.json is there)."
        ) from None
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON ({exc}).") from None
    workers = [
        t for t, s in summary.items() if t.startswith(("chief:", "worker:")) and s.get("own_steps")
    ]
    if len(workers) != 1:
        raise ModelError(
            f"{path}: {len(workers)} workers with traced steps ({', '.join(workers) or 'none'}); "
            "--from-run needs a traced run of one worker (roles: {worker: 1}) whose trace "
            "marks its steps."
        )
    p = summary[workers[0]]["per_step_ms"]
    seconds = (p["total"] - p["communication"] - p["recv_wait"]) / 1000.0
    if seconds <= 0:
        raise ModelError(f"{path}: {workers[0]}'s traced steps hold no compute.")
    return seconds, workers[0], int(summary[workers[0]]["steps"])


def parse_link(text: str) -> Link:
    """``LATENCY_US,BANDWIDTH_MB_S`` (e.g. 50,1000) as a Link."""
    try:
        latency, bandwidth = (float(x) for x in text.split(","))
    except ValueError:
        raise ModelError(
            f"--link {text!r}: give latency in µs and bandwidth in MB/s, e.g. --link 50,1000."
        ) from None
    if latency < 0 or bandwidth <= 0:
        raise ModelError(f"--link {text!r}: latency at least 0, bandwidth above 0.")
    return Link(latency * 1e-6, bandwidth * 1e6)


def load_netbench(path: Path) -> dict:
    candidate = path / "netbench.json" if path.is_dir() else path
    try:
        return json.loads(candidate.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no netbench result at {candidate}; run 'tflaunch netbench'.") from None
    except ValueError as exc:
        raise ModelError(f"{candidate} is not JSON ({exc}).") from None


def load_inputs(path: Path) -> Inputs:
    try:
        return Inputs.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ModelError(
            f"no model inputs at {path}; write them with 'tflaunch model --save'."
        ) from None
    except ValueError as exc:
        raise ModelError(f"{path} is not JSON ({exc}).") from None


def model_variables(model: str, num_classes: int) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """The model's trainable variables, from one TensorFlow graph build (as tflaunch placement)."""
    from tflaunch.models.registry import UnknownModelError, get_model_spec
    from tflaunch.tools.placement_command import model_variables

    try:
        spec = get_model_spec(model)
    except UnknownModelError as exc:
        raise ModelError(str(exc)) from None
    variables = model_variables(spec, num_classes, command="model")
    return tuple((v.name, tuple(v.shape), v.dtype_size) for v in variables)


def workers_rate(text: str) -> tuple[int, float]:
    try:
        workers, rate = text.split("=")
        return int(workers), float(rate)
    except ValueError:
        raise ModelError(
            f"--compute-img-s-at {text!r}: write W=IMG_S, e.g. 8=28.4 (each of 8 lone workers "
            "computing at once made 28.4 images/sec)."
        ) from None
