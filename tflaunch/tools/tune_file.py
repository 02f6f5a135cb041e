"""The cluster file ``tflaunch tune`` tunes: read once, and a setting applied to it one way.

A setting changes the file's mapping (:func:`tflaunch.tools.tune_settings.tuned_document`:
``roles.ps``, ``placement.ps``, the program's argv); the configuration tune plans, checks and
runs for that setting is that mapping validated, so what tune measures is what it writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tflaunch import launch
from tflaunch.cluster.config import ClusterConfig, parse_config, read_config_text
from tflaunch.outfiles import check_outside, write_outside
from tflaunch.runtime.runfiles import replace_run_file
from tflaunch.tools import tune_settings as ts
from tflaunch.tools.tune_settings import Ranked, Setting, TuneError


@dataclass(frozen=True)
class ClusterFile:
    """The file as read (its validated configuration and its mapping) and its own plan's
    training tasks per host."""

    path: Path
    config: ClusterConfig
    document: Mapping[str, Any]
    workers_per_host: int

    @classmethod
    def read(cls, path: str | Path) -> ClusterFile:
        """Read and validate the file; a file whose own plan fails is refused here, before
        anything runs."""
        path = Path(path)
        text = read_config_text(path)
        config = parse_config(text, str(path), str(path.resolve().parent))
        document = yaml.safe_load(text)
        if not isinstance(document, Mapping):
            raise TuneError(f"{path}: the cluster file is not a mapping.")
        return cls(path, config, document, workers_per_host(config))

    def document_with(self, setting: Setting, argv: Sequence[str]) -> dict:
        """The file's mapping with ``setting`` applied and the program's ``argv``."""
        return ts.tuned_document(self.document, setting, argv, self.workers_per_host)

    def config_with(self, setting: Setting, argv: Sequence[str], name: str = "") -> ClusterConfig:
        """The configuration of :meth:`document_with` (named ``name`` when given)."""
        text = yaml.safe_dump(self.document_with(setting, argv), sort_keys=False)
        config = parse_config(text, str(self.path), self.config.base_dir)
        return replace(config, name=name) if name else config


def workers_per_host(config: ClusterConfig) -> int:
    """The most training tasks the file's own plan puts on one host."""
    counts: dict[str, int] = {}
    for task in launch.plan_cluster(config).tasks:
        if task.job in ("chief", "worker"):
            counts[task.host] = counts.get(task.host, 0) + 1
    return max(counts.values(), default=1)


TUNED_MARK = b"# tflaunch tune "  # how a tuned file starts: one tune may replace another's


def write_tuned(
    file: ClusterFile, winner: Ranked, argv: Sequence[str], run_id: str, run_dir: Path,
    out: Path | None, force: bool = False,
) -> tuple[Path, ClusterConfig]:  # fmt: skip
    """tuned.yaml in the run directory, and the runnable copy beside the cluster file (its
    relative paths, such as ssh.identity_file or program.workdir, stay right there), or at
    ``out``, through :func:`tflaunch.outfiles.write_outside` (an existing file not written
    by tune, or a symlink, only with ``force``). The one place tune writes a cluster file;
    returns where, and the configuration it validated from what it wrote (``--apply`` starts
    that, never the file read back)."""
    doc = file.document_with(winner.setting, argv)
    measured = f", measured {winner.measured:.2f}" if winner.measured is not None else ""
    header = comment_safe(
        f"{file.path.name} (run {run_id}): {winner.setting.label}, predicted "
        f"{winner.images_per_sec:.2f} img/s{measured}"
    )
    text = f"{TUNED_MARK.decode()}{header}\n" + yaml.safe_dump(doc, sort_keys=False, width=100)
    path = tuned_path(file, out)
    config = parse_config(text, str(path), file.config.base_dir)
    launch.plan_cluster(config)  # it must validate and plan, or tune has a bug to show
    write_outside(path, text, _is_tuned, force)
    replace_run_file(run_dir / "tuned.yaml", text)
    return path, config


def tuned_path(file: ClusterFile, out: Path | None) -> Path:
    """Where the runnable tuned file goes: ``out``, else ``<stem>.tuned.yaml`` beside the file."""
    return out or file.path.with_name(f"{file.path.stem}.tuned.yaml")


def check_tuned_path(file: ClusterFile, out: Path | None, force: bool) -> None:
    """Refuse, before anything is measured, a tuned path :func:`write_tuned` would refuse."""
    check_outside(tuned_path(file, out), _is_tuned, force)


def _is_tuned(head: bytes) -> bool:
    return head.startswith(TUNED_MARK)


def comment_safe(text: str) -> str:
    """``text`` for one YAML comment line: every character outside printable ASCII escaped
    (a newline, or one of the other line breaks YAML knows, would end the comment and start
    keys of the file)."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in text)
