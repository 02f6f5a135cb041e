"""The many-core lab's report (``benchmarks/manycore_lab.py --phase report``): the table per
(model, rate, mode) of its results file, each row beside ``tflaunch model``'s prediction (inputs
from the lab's calibration, assumptions 9-11) and the limit its busiest link sets. Needs no hosts;
imported by the lab and by tests/test_manycore_lab.py."""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PS, DR, CAR, DAR = (
    "parameter_server",
    "distributed_replicated",
    "collective_all_reduce",
    "distributed_all_reduce",
)


def model_inputs(store: dict, model: str, rate: str):
    """``tflaunch model``'s inputs from the calibration (assumptions 9-11): compute from the lone
    worker, the link from netbench at the rate, gRPC's CPU per byte from the unshaped stream,
    the loaded PS from netbench's PS test, and the ring's CPU per byte fitted to our default
    ring rows (one value over both rates)."""
    sys.path.insert(0, str(ROOT))
    from tflaunch.tools import perfmodel as pm
    from tflaunch.tools import perfmodel_inputs as pi

    cal = store["calibration"]
    batch = store["settings"]["batch"]
    from tflaunch.models.registry import get_model_spec
    from tflaunch.tools.placement_command import model_variables

    variables = tuple(
        (v.name, tuple(v.shape), v.dtype_size) for v in model_variables(get_model_spec(model), 1001)
    )
    unshaped = pi.link_from_netbench(cal["netbench_unshaped"])
    base = pm.Inputs(
        pi.compute_from_single(cal[f"lone_{model}"], batch),
        batch,
        variables,
        pi.link_from_netbench(cal[f"netbench_{rate}"]),
        cpu_s_per_byte=1 / unshaped.bandwidth,
        cores_per_host=cal["cores_per_host"],
        ps_bytes_per_s=loaded_ps_rate(cal, 4),
    )
    fits = []
    for r in store.get("runs", []):
        if (r["side"], r["model"], r["update"], r["options"]) != ("ours", model, CAR, []):
            continue
        if "img_s" not in r:
            continue
        inputs = dataclasses.replace(base, link=pi.link_from_netbench(cal[f"netbench_{r['rate']}"]))
        w = r["workers"]
        moved = 2 * (w - 1) / w * inputs.model_bytes
        link_s = moved / inputs.link.bandwidth + 2 * (w - 1) * inputs.link.latency_s
        step = w * batch / r["img_s"]
        fits.append((step - inputs.compute_s - link_s) / moved)
    ring_cpu = statistics.median(fits) if fits else 0.0
    return dataclasses.replace(base, ring_cpu_s_per_byte=max(0.0, ring_cpu))


def loaded_ps_rate(cal: dict, workers: int) -> float:
    """Bytes a second one PS moved in and out together, from netbench's PS test at the load
    nearest ``workers`` (4 workers, and the fan-in load where calibrated): a measurement, never
    extrapolated; between two loads, linear in the workers."""
    loads = {}
    for key, value in cal.items():
        if key == "netbench_unshaped" or key.startswith("netbench_fanin_"):
            ps = value["ps"]
            loads[ps["num_workers"]] = sum(ps["steps_per_s"]) * ps["total_bytes"] * 2 / ps["num_ps"]
    below = [w for w in loads if w <= workers]
    above = [w for w in loads if w >= workers]
    if not below or not above:
        return loads[min(loads, key=lambda w: abs(w - workers))]
    lo, hi = max(below), min(above)
    if lo == hi:
        return loads[lo]
    return loads[lo] + (loads[hi] - loads[lo]) * (workers - lo) / (hi - lo)


def predicted(inputs, r: dict, cal: dict | None = None) -> float:
    from tflaunch.tools import perfmodel as pm

    if cal is not None:
        inputs = dataclasses.replace(inputs, ps_bytes_per_s=loaded_ps_rate(cal, r["workers"]))

    opts = r["options"]
    # The peer's round robin follows its own variables' order, which spreads InceptionV3's
    # kernels over the PS (ours puts 95.2 of 95.3 MB on PS 0): modelled as balanced (LPT).
    default = "lpt" if r["side"] == "peer" else "round_robin"
    placement = next(
        (o.split("=")[1] for o in opts if o.startswith("--variable_placement")), default
    )
    packs = next((int(o.split("=")[1]) for o in opts if o.startswith("--gradient_repacking")), 1)
    bucket_mb = next(
        (float(o.split("=")[1]) for o in opts if o.startswith("--all_reduce_bucket_mb")), 0.0
    )
    update = PS if r["update"] == DR else r["update"]
    return pm.predict(
        inputs,
        r["workers"],
        r["ps"],
        update,
        placement,
        staged="--staged_vars" in opts,  # (synchronous steps: the same as overlap)
        sync=r["sync"],
        packs=packs,
        compact="--compact_gradient_transfer" in opts,
        bucket_bytes=int(bucket_mb * 1e6),
    ).images_per_sec


def link_limit(inputs, r: dict) -> float:
    """The img/s the row's links allow at most (the link-bound limit), from the bytes that cross
    its busiest link each step: a ring (ours' all-reduce, the peer's collective and xring) moves
    2(W-1)/W of the gradients each way on every worker's link, in float16 with
    ``--compact_gradient_transfer``; with PS (parameter_server, distributed_replicated, the
    peer's pscpu all-reduce) the fullest PS sends and receives W times its share, full duplex,
    the shares taken as balanced (LPT; the peer's round robin modelled so too)."""
    w, batch = r["workers"], inputs.batch_size
    opts = r["options"]
    ring = r["update"] == CAR or (r["update"] == DAR and "--all_reduce_spec=xring" in opts)
    if ring:
        wire = inputs.model_bytes / (2 if "--compact_gradient_transfer" in opts else 1)
        seconds = 2 * (w - 1) / w * wire / inputs.link.bandwidth
    else:
        seconds = w * inputs.model_bytes / r["ps"] / inputs.link.bandwidth
    return w * batch / seconds


def report(a, store: dict) -> None:
    runs = store.get("runs", [])
    keys: dict[str, list[dict]] = {}
    for r in runs:
        keys.setdefault(r["key"], []).append(r)
    inputs = {}
    if "calibration" in store:
        for model in {r["model"] for r in runs}:
            for rate in {r["rate"] for r in runs}:
                inputs[model, rate] = model_inputs(store, model, rate)
        for (model, rate), i in sorted(inputs.items()):
            print(
                f"model inputs {model} {rate}: compute {i.compute_s * 1e3:.0f} ms, link "
                f"{i.link.bandwidth / 1e6:.0f} MB/s {i.link.latency_s * 1e3:.2f} ms, gRPC CPU "
                f"{i.cpu_s_per_byte * 1e9:.2f} ns/B on {i.cores_per_host} core(s), loaded PS "
                f"{i.ps_bytes_per_s / 1e6:.0f} MB/s in+out, ring CPU "
                f"{i.ring_cpu_s_per_byte * 1e9:.2f} ns/B (fitted)"
            )
    print(
        "| side | model | rate | W | P | variable update | mode | options | n | img/s | ± sd "
        "| model | error | link limit | of it |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {}
    for rs in keys.values():
        r0 = rs[0]
        vals = [r["img_s"] for r in rs if "img_s" in r]
        mode = "sync" if r0["sync"] else "async"
        head = (
            f"| {r0['side']} | {r0['model']} | {r0['rate']} | {r0['workers']} | "
            f"{r0['ps'] or '-'} | {r0['update']} | {mode} | {' '.join(r0['options']) or '-'} |"
        )
        if not vals:
            error = rs[-1]["error"].replace("\n", " ").replace("|", "/")[:120]
            print(f"{head} 0 | fails: {error} | | | | | |")
            continue
        mean = statistics.fmean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        model = err = limit = share = ""
        if (r0["model"], r0["rate"]) in inputs and r0["update"] != DAR:
            pred = predicted(inputs[r0["model"], r0["rate"]], r0, store["calibration"])
            e = 100 * (pred - mean) / mean
            errors.setdefault(r0["rate"], []).append(abs(e))
            model, err = f"{pred:.2f}", f"{e:+.1f} %"
        if (r0["model"], r0["rate"]) in inputs:
            bound = link_limit(inputs[r0["model"], r0["rate"]], r0)
            limit, share = f"{bound:.2f}", f"{100 * mean / bound:.0f} %"
        print(f"{head} {len(vals)} | {mean:.2f} | {sd:.2f} | {model} | {err} | {limit} | {share} |")
    for rate, es in sorted(errors.items()):
        print(
            f"model at {rate}: median absolute error {statistics.median(es):.1f} %, largest "
            f"{max(es):.1f} % over {len(es)} rows"
        )
