"""The pure half of ``tflaunch tune``: which settings a cluster file allows, their ranking by the
performance model, where the model is out of its depth, and the tuned cluster file.

A :class:`Setting` is what tune may change in a cluster file: the PS count (``roles.ps``), where
the PS go (``placement.ps``: co-located on worker hosts or dedicated hosts), and for a program that
takes tf_cnn_benchmarks' flags (``tflaunch.models.benchmark``, or any program whose argv already
passes them) the variable update, the variable placement and how variables cross the link
(``--staged_vars``, ``--transfer_order tic``; for all-reduce ``--gradient_repacking`` and
``--compact_gradient_transfer``). The program's training mode (``--cross_replica_sync``) is not
a knob: tune keeps it and ranks the PS settings in it. Nothing here runs anything or imports
TensorFlow.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tflaunch.errors import TflaunchError
from tflaunch.models.placement_math import STRATEGIES
from tflaunch.text import aligned

PS_UPDATES = ("parameter_server", "distributed_replicated")
ALL_REDUCE = "collective_all_reduce"
# How variables cross the link: as they come, staged one step ahead (parameter_server only),
# or read in consumption order in buckets (TicTac; both PS modes). The all-reduce's gradients:
# as TensorFlow sends them (one pack after the backward pass), in ALL_REDUCE_PACKS packs whose
# first cross during the backward pass, as float16 (half the bytes; applied in float32), or both.
TRANSFERS = {
    "parameter_server": ("none", "staged", "tic"),
    "distributed_replicated": ("none", "tic"),
    ALL_REDUCE: ("none", "packed", "float16", "packed_float16"),
}
ALL_TRANSFERS = tuple(dict.fromkeys(t for ts in TRANSFERS.values() for t in ts))
# --gradient_repacking for "packed": the many-core lab's best (docs/performance.md)
ALL_REDUCE_PACKS = 4
# absl's spellings of a boolean flag's value, as tflaunch.models.benchmark reads them
TRUE_WORDS = ("1", "true", "t", "yes", "y")
FALSE_WORDS = ("0", "false", "f", "no", "n")
BOOLEAN_WORDS = TRUE_WORDS + FALSE_WORDS
PS_HOSTS = ("colocated", "dedicated")
BENCHMARK_MODULE = "tflaunch.models.benchmark"
# The model's median error where it holds (shaped lab 4.0 %, 64 cores 4.7 %): a lead smaller
# than this is not a ranking the model can make.
MODEL_ERROR = 0.05
# Bytes per second of gRPC traffic one core handles for TensorFlow (netbench: one 64 MB stream
# reached 800 MB/s on 2 shared cores): above a quarter of it per core, gRPC's CPU cost, which
# the model leaves out, starts to bind.
GRPC_BYTES_PER_CORE = 400e6
GRPC_SHARE = 0.25


class TuneError(TflaunchError):
    """The cluster file or the measurements do not allow tuning; the message says why."""


@dataclass(frozen=True, order=True)
class Setting:
    """One point of the grid tune ranks."""

    ps: int
    update: str
    strategy: str = "round_robin"
    transfer: str = "none"
    ps_hosts: str = "colocated"

    @property
    def label(self) -> str:
        if self.update == ALL_REDUCE:
            return "all-reduce" + ("" if self.transfer == "none" else f" {self.transfer}")
        update = "ps" if self.update == "parameter_server" else "replicated"
        transfer = "" if self.transfer == "none" else f" {self.transfer}"
        return f"{self.ps} PS {self.ps_hosts} {self.strategy} {update}{transfer}"

    @property
    def overlap(self) -> bool:
        return self.transfer != "none"

    @property
    def packs(self) -> int:
        """The all-reduce's packs (1: TensorFlow's default, one after the backward pass)."""
        return ALL_REDUCE_PACKS if self.transfer.startswith("packed") else 1

    @property
    def compact(self) -> bool:
        """The all-reduce's gradients cross the wire as float16."""
        return self.transfer.endswith("float16")

    def to_dict(self) -> dict:
        return {
            "ps": self.ps,
            "update": self.update,
            "strategy": self.strategy,
            "transfer": self.transfer,
            "ps_hosts": self.ps_hosts,
        }


@dataclass(frozen=True)
class Knobs:
    """What the program lets tune change (from its argv)."""

    updates: tuple[str, ...]
    strategies: tuple[str, ...]
    transfers: bool  # the program takes --staged_vars, --transfer_order and the all-reduce's
    transfer_choices: tuple[str, ...] = ALL_TRANSFERS
    # Not a knob: the program's PS training mode (--cross_replica_sync), which tune keeps.
    sync: bool = False

    @classmethod
    def of(cls, argv: Sequence[str]) -> Knobs:
        """tflaunch.models.benchmark: everything; another program: the flags it already passes
        (``--variable_placement``, ``--variable_update``), else only the PS count and hosts."""
        benchmark = BENCHMARK_MODULE in argv
        flags = {a.split("=", 1)[0] for a in argv}
        updates = (*PS_UPDATES, ALL_REDUCE) if benchmark or "--variable_update" in flags else ()
        strategies = STRATEGIES if benchmark or "--variable_placement" in flags else ()
        return cls(
            updates or ("parameter_server",),
            strategies or (flag_value(argv, "--variable_placement") or "round_robin",),
            benchmark,
            sync=cross_replica_sync(argv),
        )

    def limited(
        self,
        updates: Sequence[str] = (),
        strategies: Sequence[str] = (),
        transfers: Sequence[str] = (),
    ) -> Knobs:
        """Only the given values (each empty: all the program allows); a value the program
        does not allow is a TuneError."""

        def pick(given: Sequence[str], allowed: Sequence[str], what: str) -> tuple[str, ...]:
            bad = [g for g in given if g not in allowed]
            if bad:
                raise TuneError(
                    f"--{what} {bad[0]!r}: this program allows {', '.join(allowed)} here."
                )
            return tuple(a for a in allowed if a in given) if given else tuple(allowed)

        allowed_transfers = self.transfer_choices if self.transfers else ("none",)
        return Knobs(
            pick(updates, self.updates, "updates"),
            pick(strategies, self.strategies, "placements"),
            self.transfers,
            pick(transfers, allowed_transfers, "transfers"),
            self.sync,
        )

    @property
    def mode(self) -> str:
        """The training mode the PS settings are ranked in, for tune's output."""
        if self.sync:
            return "synchronous PS steps (the program's --cross_replica_sync), as all-reduce's"
        if ALL_REDUCE in self.updates:
            return "asynchronous PS (the program's default); all-reduce is synchronous"
        return "asynchronous PS (the program's default)"


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in ``argv`` (the last one), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def cross_replica_sync(argv: Sequence[str]) -> bool:
    """Whether the program runs synchronous PS steps: ``--cross_replica_sync`` alone, or with a
    true value (``=true``, `` 1``); the last one counts, as in tflaunch.models.benchmark."""
    sync = False
    for i, arg in enumerate(argv):
        if arg == "--cross_replica_sync":
            following = argv[i + 1].lower() if i + 1 < len(argv) else ""
            sync = following not in FALSE_WORDS
        elif arg.startswith("--cross_replica_sync="):
            sync = arg.split("=", 1)[1].lower() in TRUE_WORDS
    return sync


def with_flag(argv: Sequence[str], flag: str, value: str | None, switch: bool = False) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (appended if absent), or removed when ``value``
    is None; a ``switch`` (``--staged_vars``) takes no value: any ``value`` but None sets it. A
    switch's own spelled-out value (``--compact_gradient_transfer false``) goes with it."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == flag:
            following = argv[i + 1].lower() if i + 1 < len(argv) else None
            skip = following is not None and (not switch or following in BOOLEAN_WORDS)
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    if value is None:
        return out
    return [*out, flag] if switch else [*out, flag, value]


def setting_argv(argv: Sequence[str], setting: Setting, knobs: Knobs) -> list[str]:
    """The program's argv for ``setting``: its flags set, other flags untouched."""
    out = list(argv)
    if len(knobs.updates) > 1 or flag_value(argv, "--variable_update"):
        out = with_flag(out, "--variable_update", setting.update)
    if len(knobs.strategies) > 1 and setting.update != ALL_REDUCE:
        out = with_flag(out, "--variable_placement", setting.strategy)
    if knobs.transfers:
        staged = "" if setting.transfer == "staged" else None
        out = with_flag(out, "--staged_vars", staged, switch=True)
        tic = "tic" if setting.transfer == "tic" else None
        out = with_flag(out, "--transfer_order", tic)
        ring = setting.update == ALL_REDUCE
        packs = str(setting.packs) if ring and setting.packs > 1 else None
        out = with_flag(out, "--gradient_repacking", packs)
        compact = "" if ring and setting.compact else None
        out = with_flag(out, "--compact_gradient_transfer", compact, switch=True)
    return out


def enumerate_settings(
    max_ps: int, knobs: Knobs, ps_hosts: Sequence[str] = PS_HOSTS
) -> list[Setting]:
    """Every setting: P = 1..max_ps x PS hosts x placement x update x transfer, and all-reduce
    once per way its gradients cross. One PS makes every placement the same: round robin only."""
    out = []
    for update in knobs.updates:
        transfers = (
            tuple(t for t in TRANSFERS[update] if t in knobs.transfer_choices)
            if knobs.transfers
            else ("none",)
        )
        if update == ALL_REDUCE:
            out += [Setting(0, ALL_REDUCE, "-", transfer, "-") for transfer in transfers]
            continue
        for p in range(1, max_ps + 1):
            strategies = knobs.strategies if p > 1 else knobs.strategies[:1]
            for hosts in ps_hosts:
                for strategy in strategies:
                    for transfer in transfers:
                        out.append(Setting(p, update, strategy, transfer, hosts))
    return out


@dataclass(frozen=True)
class Ranked:
    """A setting, its predicted images/sec, what binds it, and the model's caveats."""

    setting: Setting
    images_per_sec: float
    step_s: float
    bound: str
    notes: tuple[str, ...] = ()
    measured: float | None = None


# Simpler first, among settings the model cannot tell apart: fewer PS, co-located, the default
# update, no transfer change (and full-precision gradients), the simplest placement.
def simplicity(s: Setting) -> tuple:
    strategies = {name: i for i, name in enumerate(STRATEGIES)}
    updates = {"parameter_server": 0, "distributed_replicated": 1, ALL_REDUCE: 2}
    transfers = {"none": 0, "staged": 1, "packed": 1, "tic": 2, "float16": 2, "packed_float16": 3}
    return (
        s.ps,
        0 if s.ps_hosts in ("colocated", "-") else 1,
        updates[s.update],
        transfers[s.transfer],
        strategies.get(s.strategy, 0),
    )


def rank(rows: Iterable[Ranked], tie: float = 0.01) -> list[Ranked]:
    """Fastest first; predictions within ``tie`` (1 %) of each other go simplest first."""
    rows = sorted(rows, key=lambda r: -r.images_per_sec)
    out: list[Ranked] = []
    while rows:
        top = rows[0].images_per_sec
        close = [r for r in rows if r.images_per_sec >= (1 - tie) * top]
        close.sort(key=lambda r: simplicity(r.setting))
        out += close
        rows = [r for r in rows if r not in close]
    return out


def margin(ranked: Sequence[Ranked], tie: float = 0.01) -> tuple[float | None, int]:
    """The top setting's lead over the best prediction that differs from it by more than
    ``tie`` (settings the model cannot tell apart are not "the next"), as a fraction, and how
    many settings tie with the top (itself included)."""
    if not ranked:
        return None, 0
    top = ranked[0].images_per_sec
    tied = [r for r in ranked if r.images_per_sec >= (1 - tie) * top]
    rest = [r for r in ranked if r.images_per_sec < (1 - tie) * top]
    if not rest or rest[0].images_per_sec <= 0:
        return None, len(tied)
    return top / rest[0].images_per_sec - 1, len(tied)


def next_distinct(ranked: Sequence[Ranked], tie: float = 0.01) -> Ranked | None:
    """The first setting predicted more than ``tie`` below the top."""
    top = ranked[0].images_per_sec if ranked else 0.0
    return next((r for r in ranked if r.images_per_sec < (1 - tie) * top), None)


@dataclass(frozen=True)
class Context:
    """What the caveats need to know about the cluster and the calibration."""

    workers: int
    cores_per_host: int
    link_bandwidth: float  # bytes/s
    model_bytes: int
    shared_cores: bool
    contention_measured_at: tuple[int, ...] = ()
    traffic_notes: Mapping[str, Any] = field(default_factory=dict)
    nic: bool = True  # False: every task on one host, talking over loopback
    sync: bool = False  # the PS settings run synchronous steps (--cross_replica_sync)


def modelled_as(setting: Setting, nic: bool) -> Setting:
    """The setting the model predicts for ``setting``: staged variables on one host (loopback)
    as unstaged, since there the transfers take the cores staging would hide them behind (on
    a 16-core machine, 2 cores a task: staged 0.94-0.98 of unstaged, where the overlap
    predicted 1.25-1.35); a race (--verify) measures it."""
    if not nic and setting.transfer == "staged" and setting.update != ALL_REDUCE:
        return replace(setting, transfer="none")
    return setting


def caveats(row: Ranked, ctx: Context) -> tuple[str, ...]:
    """Where the prediction for ``row`` rests on something the model does not have."""
    notes = []
    s = row.setting
    steps_per_s = ctx.workers / row.step_s if row.step_s > 0 else 0.0
    # Bytes through the busiest host: a worker pulls and pushes the model every step; a
    # co-located PS host carries its PS's share of every worker's traffic besides.
    per_worker = 2 * ctx.model_bytes * steps_per_s / ctx.workers
    busiest = per_worker
    if s.update != ALL_REDUCE and s.ps:
        ps_traffic = 2 * ctx.model_bytes * steps_per_s / s.ps
        busiest = max(per_worker, ps_traffic + (per_worker if s.ps_hosts == "colocated" else 0))
    budget = GRPC_SHARE * GRPC_BYTES_PER_CORE * ctx.cores_per_host
    if ctx.cores_per_host and busiest > budget:  # 0: the hosts' cores are not known
        notes.append(
            f"gRPC CPU: {busiest / 1e6:.0f} MB/s through one host of {ctx.cores_per_host} "
            "core(s); the model leaves gRPC's own CPU cost out, so this is an upper bound"
        )
    if s.ps_hosts == "colocated" and s.update != ALL_REDUCE and not ctx.shared_cores:
        notes.append("co-located PS: their CPU on the workers' hosts is taken as free")
    if row.bound == "cores":
        notes.append("shared cores bind: the PS's own CPU is not in the model")
    if ctx.sync and s.update != ALL_REDUCE:
        if s.ps_hosts == "colocated" and ctx.nic:
            notes.append(
                "synchronous PS on the workers' hosts: the model of synchronous steps takes "
                "each PS's link as its own"
            )
        if s.transfer == "tic":
            notes.append(
                "ordered reads under the synchronous barrier are not in the model: predicted "
                "as without them"
            )
    if not ctx.nic and s.transfer == "staged" and s.update != ALL_REDUCE:
        notes.append(
            "staged on one host: the transfers are gRPC's CPU over loopback on the tasks' own "
            "cores, so staging hides little (measured 0.94-0.98 of unstaged on 16 shared "
            "cores); predicted as unstaged"
        )
    elif not ctx.nic and s.overlap and s.update != ALL_REDUCE:
        notes.append(
            f"{s.transfer} on one host: the transfers are gRPC's CPU over loopback, partly on "
            "the workers' own cores; the model takes them as running beside the compute"
        )
    if ctx.contention_measured_at and ctx.workers > max(ctx.contention_measured_at):
        notes.append(
            f"compute contention extrapolated past {max(ctx.contention_measured_at)} workers"
        )
    return tuple(notes)


def verdict(ranked: Sequence[Ranked]) -> list[str]:
    """What to make of the ranking: the top's margin, and whether the model can call it."""
    if not ranked:
        return ["no setting could be planned"]
    top = ranked[0]
    lines = [f"top: {top.setting.label}, {top.images_per_sec:.2f} img/s predicted"]
    lead, tied = margin(ranked)
    if tied > 1:
        lines.append(
            f"{tied} settings are predicted within 1 % of it (the model cannot tell them "
            "apart; the simplest is first)"
        )
    follower = next_distinct(ranked)
    if lead is not None and follower is not None:
        lines.append(
            f"margin: {100 * lead:.1f} % over the next, {follower.setting.label} "
            f"({follower.images_per_sec:.2f} img/s)"
        )
        if lead < MODEL_ERROR:
            lines.append(
                f"the margin is within the model's error ({100 * MODEL_ERROR:.0f} %): "
                "measure the top settings with --verify K before trusting the order"
            )
    if top.notes:
        lines.append(
            "the model is out of its depth for the top setting: "
            + "; ".join(top.notes)
            + ". Use --verify K: measured figures decide."
        )
    return lines


def table_lines(ranked: Sequence[Ranked], limit: int | None = None) -> list[str]:
    """The ranked table."""
    rows = [("#", "PS", "HOSTS", "UPDATE", "PLACEMENT", "TRANSFER", "IMG/s", "BOUND", "MEASURED")]
    for i, r in enumerate(ranked[:limit] if limit else ranked, 1):
        s = r.setting
        rows.append(
            (
                str(i),
                str(s.ps) if s.update != ALL_REDUCE else "-",
                s.ps_hosts,
                s.update,
                s.strategy,
                s.transfer,
                f"{r.images_per_sec:.2f}",
                r.bound + ("*" if r.notes else ""),
                f"{r.measured:.2f}" if r.measured is not None else "",
            )
        )
    lines = aligned(rows)
    if any(r.notes for r in (ranked[:limit] if limit else ranked)):
        lines.append("* the model is out of its depth here (see the notes)")
    return lines


def measured_first(rows: Sequence[Ranked], first: Ranked) -> list[Ranked]:
    """``first``, then the other measured rows fastest first, then the unmeasured ones in their
    order: no setting is ranked above a measured one without being measured."""
    measured = sorted(
        (r for r in rows if r.measured is not None and r is not first),
        key=lambda r: -(r.measured or 0.0),
    )
    return [first, *measured, *(r for r in rows if r.measured is None and r is not first)]


def left_out_lines(left_out: Sequence[tuple[Setting, str]], limit: int = 4) -> list[str]:
    """The settings left out because they cannot run, one line per reason."""
    by_reason: dict[str, list[Setting]] = {}
    for setting, reason in left_out:
        by_reason.setdefault(reason, []).append(setting)
    lines = []
    for reason, settings in list(by_reason.items())[:limit]:
        more = f" and {len(settings) - 1} more" if len(settings) > 1 else ""
        lines.append(f"left out: {settings[0].label}{more}: {reason}")
    if len(by_reason) > limit:
        lines.append(f"left out for {len(by_reason) - limit} other reason(s): see tune.json")
    return lines


def model_error_line(rows: Sequence[Ranked]) -> str | None:
    """The model's median error against the measured rows, or None when none was measured."""
    errors = [abs(r.images_per_sec / r.measured - 1) for r in rows if r.measured]
    if not errors:
        return None
    return (
        f"model against measurement: median error {100 * statistics.median(errors):.1f} % "
        f"over {len(errors)} settings"
    )


def tuned_document(
    raw: Mapping[str, Any], setting: Setting, argv: Sequence[str], workers_per_host: int | None
) -> dict:
    """The cluster file's mapping with the setting applied: roles.ps, placement.ps and the
    program's argv. Dedicated PS keep the workers spread as the file's own plan spreads them
    (``workers_per_host``, unless the file sets it): the calibration measured them so, and the
    planner would otherwise pack them onto fewer hosts to leave hosts for the PS."""
    doc = dict(raw)
    roles = dict(doc.get("roles") or {})
    roles["ps"] = setting.ps
    doc["roles"] = roles
    if setting.update != ALL_REDUCE:
        placement = dict(doc.get("placement") or {})
        placement["ps"] = setting.ps_hosts
        if setting.ps_hosts == "dedicated":
            placement.pop("ps_per_host", None)
            if workers_per_host and "workers_per_host" not in placement:
                placement["workers_per_host"] = workers_per_host
        doc["placement"] = placement
    program = doc.get("program")
    program = {"argv": program} if isinstance(program, list) else dict(program or {})
    program["argv"] = list(argv)
    doc["program"] = program
    return doc
