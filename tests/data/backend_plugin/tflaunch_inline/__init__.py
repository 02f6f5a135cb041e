"""The ``inline`` backend: what a package outside tflaunch registers (entry point
``tflaunch.backends``): its name, its ``inline:`` section of the cluster file with a check, and
where its Backend class is."""

from __future__ import annotations

from dataclasses import dataclass

from tflaunch.plugin import BackendSpec, Fail, field


@dataclass(frozen=True)
class InlineSection:
    """Inline backend settings (backend: inline)."""

    greeting: str = field("inline backend here", doc="printed before the agents start")
    agents_env: str = field("TFLAUNCH_INLINE", doc="variable every agent gets, set to the greeting")


def check(config, fail: Fail) -> None:
    if config.backend == "inline" and not config.section(InlineSection).greeting.strip():
        fail(("inline", "greeting"), "is empty; say something, e.g. 'hello'")


BACKEND = BackendSpec(
    name="inline",
    backend="tflaunch_inline.backend:InlineBackend",
    section=InlineSection,
    section_doc="Inline backend settings",
    check=check,
)
