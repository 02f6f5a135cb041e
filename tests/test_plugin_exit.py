"""A plugin that exits at import (issue 39): ``sys.exit(0)`` in an installed backend's or
cloud's module is the same one-line error as an exception there, with a non-zero exit, instead
of every command exiting 0 silently (``validate`` "passing" in CI). The plugin is a module and
a ``.dist-info`` on the PYTHONPATH of a ``tflaunch`` process: importlib.metadata finds its
entry point there as it would an installed package's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import FAKE_TASK, tflaunch, write_cluster


def _plugin(site: Path, group: str, body: str) -> dict[str, str]:
    """The environment of a tflaunch process that finds a plugin in ``group`` whose module
    runs ``body`` at import."""
    site.mkdir()
    (site / "exiting_plugin.py").write_text(body)
    info = site / "exiting_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exiting-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\nexiting = exiting_plugin:SPEC\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


@pytest.mark.parametrize("group", ["tflaunch.backends", "tflaunch.clouds"])
@pytest.mark.parametrize("body", ["import sys\nsys.exit(0)\n", "raise RuntimeError('broken')\n"])
def test_a_plugin_that_exits_or_raises_at_import_is_one_error_line(tmp_path, group, body):
    env = _plugin(tmp_path / "site", group, body)
    cluster = write_cluster(tmp_path / "c.yaml", {"argv": ["python3", str(FAKE_TASK)]})
    result = tflaunch("validate", "--offline", str(cluster), env=env, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    kind = "backend" if group == "tflaunch.backends" else "cloud"
    assert lines[0].startswith(f"tflaunch: error: the {kind} 'exiting' of an installed package")
    assert ("SystemExit: 0" if "exit" in body else "RuntimeError: broken") in lines[0]
