"""The docs check fails on a page naming a program module that does not exist (issue 40): a
``python -m X`` whose X is no module, and a list of ``python -m tflaunch.models.<name>``
programs that names one models/ lacks or leaves one out (docs/programs.md listed
``trace_capture``, which is ``tflaunch.trace.capture``, and left out ``tune_probe``)."""

from __future__ import annotations

import pytest
from docs_check import ROOT, _programs, check_text

LISTED = "`mnist`, `pss`, `benchmark`, `tfrecords`, `netbench`, `tune_probe`, and `smoke`"


def problems_of(text: str) -> list[str]:
    return [str(p) for p in check_text(text, ROOT / "docs" / "programs.md")]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "run `python -m tflaunch.models.trace_capture`",
            "'python -m tflaunch.models.trace_capture': no such module",
        ),
        (
            "```sh\npython3 -m no_such_module_for_tflaunch x\n```",
            "'python -m no_such_module_for_tflaunch'",
        ),
        ("`python -m tflaunch.runtime.nothing`", "'python -m tflaunch.runtime.nothing': no such"),
        (
            f"- programs, run as `python -m tflaunch.models.<name>`: {LISTED}, `trace_capture`;",
            "names 'tflaunch.models.trace_capture', which does not exist",
        ),
        (
            "- programs, run as `python -m tflaunch.models.<name>`: `mnist`, `pss`, `benchmark`, "
            "`tfrecords`, `netbench` and `smoke`;",
            "the programs list leaves out 'tflaunch.models.tune_probe'",
        ),
    ],
)
def test_the_check_notices_a_module_that_does_not_exist(text, expected):
    found = problems_of(text)
    assert any(expected in p for p in found), found


def test_the_check_accepts_modules_that_exist():
    assert "tune_probe" in _programs(ROOT) and "cluster" not in _programs(ROOT)
    text = (
        f"- programs, run as `python -m tflaunch.models.<name>`: {LISTED} (`examples/smoke.yaml`);"
        "\n`python -m tflaunch.trace.capture`, `python3 -m venv .venv`, `python -m tflaunch up`,"
        " `python -m tflaunch.models.smoke --steps 3`\n"
    )
    assert problems_of(text) == []
