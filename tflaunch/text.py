"""Text for the terminal: tables, times, and what of others' text a terminal may be shown."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as lines, each column left-aligned to its widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


# 10000-01-01 UTC: the first second strftime's four-digit year cannot write.
_LAST_TIME = 253402300800.0


def usable_time(value: object) -> float | None:
    """``value`` as a unix time, or None where it cannot be one: not a number, not finite
    (JSON's ``1e400`` reads as infinity), before 1970 or past the year 9999. Run files are
    untrusted input: a stamp like that is shown as unknown, never a crash."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    stamp = float(value)
    return stamp if math.isfinite(stamp) and 0.0 <= stamp < _LAST_TIME else None


def local_time(stamp: object) -> str:
    """A unix time as ``YYYY-mm-dd HH:MM:SS`` in local time; ``-`` for none or one that
    :func:`usable_time` refuses."""
    usable = usable_time(stamp)
    if usable is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(usable))


# What a terminal would act on in text that is not ours (a task's output, a host's reply).
_OSC8_LINK = re.compile(
    r"\x1b\]8;[^;\x07\x1b]*;([^\x07\x1b]*)(?:\x07|\x1b\\)(.*?)\x1b\]8;[^;\x07\x1b]*;(?:\x07|\x1b\\)",
    re.DOTALL,
)
_OSC8_OPEN = re.compile(r"\x1b\]8;[^;\x07\x1b]*;([^\x07\x1b]*)(?:\x07|\x1b\\)")  # one left open
_SEQUENCE = re.compile(
    r"\x1b\[([\x30-\x3f]*)([\x20-\x2f]*)([\x40-\x7e])"  # CSI: SGR is the one kept
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"  # OSC, DCS, SOS, PM, APC: up to their terminator
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"  # nF (ESC # 8, ESC ( B), Fp/Fe/Fs (ESC c, ESC 7), lone ESC
    r"|\x9b[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"  # the same as 8-bit controls: CSI
    r"|[\x90\x98\x9d-\x9f].*?(?:\x07|\x9c|\x1b\\|$)"  # DCS, SOS, OSC, PM, APC
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]",  # C0 but tab and newline, DEL, C1 (0x9b: 8-bit CSI)
    re.DOTALL,
)
_SGR_PARAMETERS = re.compile(r"[0-9;:]*")


def terminal_text(text: str) -> str:
    """``text`` as it may reach a terminal: colour and the like (SGR, ``ESC [ ... m``) kept,
    every other escape sequence and control character but tab and newline dropped (a line
    of output has no newline; a message may have several lines): a task's output (or a
    host's reply) may not reset the terminal (``ESC c``), redraw it (``ESC # 8``), move the
    cursor over other tasks' lines, set its title or the clipboard. A hyperlink (OSC 8) is shown
    as its text and its target, ``text <target>``, so a link cannot hide where it goes."""
    text = _OSC8_OPEN.sub(_shown_target, _OSC8_LINK.sub(_shown_link, text))
    return _SEQUENCE.sub(_kept, text)


def is_terminal(stream: object) -> bool:
    """Whether ``stream`` is a terminal (a dumb one too)."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def for_terminal(text: str, stream: object) -> str:
    """``text`` as :func:`terminal_text` shows it where ``stream`` is a terminal; as it is for
    a pipe or a file."""
    return terminal_text(text) if is_terminal(stream) else text


def _shown_link(match: re.Match[str]) -> str:
    target, text = match.group(1, 2)
    return f"{text} <{target}>" if target else text


def _shown_target(match: re.Match[str]) -> str:
    return f"<{match.group(1)}> " if match.group(1) else ""


def _kept(match: re.Match[str]) -> str:
    parameters, intermediates, final = match.group(1, 2, 3)
    if final == "m" and not intermediates and _SGR_PARAMETERS.fullmatch(parameters or ""):
        return match.group(0)
    return ""
