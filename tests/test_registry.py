"""The one plug-in registry (tflaunch.cluster.registry) that backends and clouds both use: lookup
by name or alias, the default, and one-paragraph errors for unknown names, claims that collide
and entry points that are not specs."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest

from tflaunch.cluster import backends, registry
from tflaunch.cluster.config import ClusterConfig
from tflaunch.cluster.registry import Registry
from tflaunch.errors import ConfigError
from tflaunch.launchers import clouds

GROUP = "tflaunch.toys"


@dataclass(frozen=True)
class ToySpec:
    name: str
    aliases: tuple[str, ...] = ()
    default: bool = False


ALPHA = ToySpec("alpha", aliases=("a",), default=True)
BETA = ToySpec("beta")
GAMMA_DEFAULT = ToySpec("gamma", default=True)
DELTA_AS_A = ToySpec("delta", aliases=("a",))


@pytest.fixture
def toys(monkeypatch):
    """A registry of toy specs from stand-in entry points (no built-in folder exports TOY)."""

    def make(*names: str) -> Registry[ToySpec]:
        points = [EntryPoint(globals()[n].name, f"{__name__}:{n}", GROUP) for n in names]
        monkeypatch.setattr(registry, "entry_points", lambda group: points)
        return Registry("toy", ToySpec, "tflaunch.launchers.clouds", "TOY", GROUP)

    return make


def test_a_name_or_an_alias_finds_the_spec_and_an_unknown_one_lists_the_names(toys):
    toys_ = toys("ALPHA", "BETA")
    assert toys_.lookup("alpha") is ALPHA and toys_.lookup("a") is ALPHA
    assert toys_.names() == ["alpha", "beta"] and toys_.choices() == ["alpha", "beta", "a"]
    assert toys_.default() is ALPHA
    with pytest.raises(
        ConfigError, match=r"^--toy: unknown toy 'alfa'; choose one of alpha, beta\.$"
    ):
        toys_.lookup("alfa", "--toy")


def test_colliding_claims_and_two_defaults_are_errors_naming_them(toys):
    with pytest.raises(ConfigError, match=rf"two installed packages register a toy called 'a' "
                       rf"\(entry points '{__name__}:ALPHA' and '{__name__}:DELTA_AS_A'"):  # fmt: skip
        toys("ALPHA", "DELTA_AS_A").names()
    with pytest.raises(ConfigError, match="toys alpha, gamma each claim to be the default toy"):
        toys("ALPHA", "GAMMA_DEFAULT").default()


def test_an_entry_point_that_is_not_a_spec_of_its_name_is_refused(toys, monkeypatch):
    with pytest.raises(ConfigError, match="does not name a tflaunch ToySpec called 'beta'"):
        toy = toys("ALPHA")
        monkeypatch.setattr(
            registry, "entry_points", lambda group: [EntryPoint("beta", f"{__name__}:ALPHA", GROUP)]
        )
        toy.names()


def test_backends_and_clouds_are_served_by_it():
    assert isinstance(backends.BACKENDS, Registry) and isinstance(clouds.CLOUDS, Registry)
    default = backends.BACKENDS.default()
    assert default is not None
    assert default.name == ClusterConfig.__dataclass_fields__["backend"].default  # 'local'
    assert clouds.default_cloud() == "ec2"
