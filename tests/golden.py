"""Golden files: compare generated text with a reviewed copy, showing a diff on mismatch.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest ...`` and review the diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path


def assert_golden(path: Path, text: str) -> None:
    """``text`` equals the golden file ``path`` (written instead under UPDATE_GOLDEN=1)."""
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 and review the diff"
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), str(path), "generated"
            )
        )
        raise AssertionError(f"generated text differs from {path}:\n{diff}")
