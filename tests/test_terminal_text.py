"""The terminal shows colour, nothing else (issue 39): what a task prints (or a host replies)
reaches a terminal with its SGR colour kept and every other escape sequence and control
dropped, and a hyperlink shown with its target; a pipe or a file gets it as it came."""

from __future__ import annotations

import io

import pytest

from tflaunch.runtime.statusline import StatusLine
from tflaunch.text import for_terminal, terminal_text

RESET = "\x1bc"  # RIS: a full reset of the terminal
ALIGNMENT = "\x1b#8"  # DECALN: fills the screen with E
LINK = "\x1b]8;;https://evil.example/x\x07docs\x1b]8;;\x07"  # shows "docs", goes elsewhere
TITLE = "\x1b]0;pwned\x1b\\"
HOSTILE = (
    f"{RESET}{ALIGNMENT}see {LINK} \x1b[31mred\x1b[0m {TITLE}\x1b[2J\x1b[H\x1b[?1049h"
    "\x1bP+q\x1b\\\x9b6n\x07tab\there"
)
SHOWN = "see docs <https://evil.example/x> \x1b[31mred\x1b[0m tab\there"


def test_only_sgr_tab_and_newline_are_kept_and_links_show_their_target():
    assert terminal_text(HOSTILE) == SHOWN
    assert terminal_text("\x1b[38;5;200;1mx\x1b[m") == "\x1b[38;5;200;1mx\x1b[m"
    assert terminal_text("a\nb\rc\x08d\x00e\x7f") == "a\nbcde"
    assert terminal_text("\x1b[1 m\x1b[?31m\x1b[31") == "31"  # not SGR; a cut-off CSI
    assert terminal_text("\x1b]8;id=7;https://a.example\x1b\\open") == "<https://a.example> open"
    assert terminal_text("plain é 日本 \x1b") == "plain é 日本 "


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_the_status_line_prints_no_reset_no_alignment_test_and_no_disguised_link(monkeypatch, term):
    """Live (rich under the status line) and plain (a dumb terminal) alike."""
    monkeypatch.setenv("TERM", term)
    out = _Terminal()
    line = StatusLine(out, lambda: "status")
    assert line.active == (term == "xterm")
    line.write(HOSTILE, prefix="[worker:0] ")
    line.write("\r[chief:0] a line that takes another task's name", prefix="[worker:1] ")
    line.stop()
    shown = out.getvalue()
    for sequence in (RESET, ALIGNMENT, "\x1b]", "\x1bP", "\x9b", "\x07", "\x1b[2J", "\x1b[H"):
        assert sequence not in shown, (sequence, shown)
    assert "[worker:0] " in shown and "docs <https://evil.example/x>" in shown
    assert "\x1b[31mred" in shown  # the colour stays
    assert "[worker:1] [chief:0] a line" in shown


def test_a_pipe_gets_the_output_as_it_came():
    out = io.StringIO()
    line = StatusLine(out, lambda: "never drawn")
    line.write(HOSTILE, prefix="[worker:0] ")
    line.stop()
    assert out.getvalue() == f"[worker:0] {HOSTILE}\n"
    assert for_terminal(HOSTILE, out) == HOSTILE
    assert for_terminal(HOSTILE, _Terminal()) == SHOWN
