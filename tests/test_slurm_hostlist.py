"""Host list expansion agrees with Slurm's own ``scontrol show hostnames``, and round-trips."""

from __future__ import annotations

import random
import re
import shutil
import subprocess

import pytest

from tests.conftest import skip_or_fail
from tflaunch.cluster import hostlist
from tflaunch.errors import LaunchError

GENERATED_LISTS = 120


def _number_range(rng: random.Random) -> str:
    start = rng.randint(0, 120)
    width = rng.choice([0, 0, 2, 3, 5])
    if rng.random() < 0.3:
        return f"{start:0{width}d}"
    end = start + rng.randint(0, 12)
    # Slurm pads both ends to one width; an unpadded start with a padded end also occurs.
    start_width = width if rng.random() < 0.8 else 0
    return f"{start:0{start_width}d}-{end:0{width}d}"


def _bracket(rng: random.Random) -> str:
    return "[" + ",".join(_number_range(rng) for _ in range(rng.randint(1, 3))) + "]"


def _prefix(rng: random.Random) -> str:
    stem = rng.choice(["nid", "node", "gpu-node-", "cn-1-", "x", "r12c", "daint-", "a-b-7"])
    return stem + rng.choice(["", "", "0", "-", "2-"])


def _item(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.2:  # a plain name, with dashes and digits
        return f"{_prefix(rng)}{rng.randint(0, 999)}"
    if kind < 0.75:  # one bracket group
        return _prefix(rng) + _bracket(rng)
    # several bracket groups (Slurm needs each group to follow a prefix and the last to end it)
    return _prefix(rng) + _bracket(rng) + rng.choice(["-", "x", "-y"]) + _bracket(rng)


def generated_lists(count: int, seed: int = 20240601) -> list[str]:
    rng = random.Random(seed)
    return [",".join(_item(rng) for _ in range(rng.randint(1, 4))) for _ in range(count)]


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory) -> dict[str, str]:
    if shutil.which("scontrol") is None:
        skip_or_fail("scontrol is not installed (apt: slurm-client)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    # scontrol needs a configuration to start, though expanding names contacts no controller.
    conf.write_text("ClusterName=hostlist-test\nSlurmctldHost=localhost\n")
    return {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}


def scontrol_hostnames(nodelist: str, env: dict[str, str]) -> list[str]:
    result = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert result.returncode == 0, f"scontrol rejected {nodelist!r}: {result.stderr}"
    return result.stdout.split()


def test_generated_lists_cover_the_tricky_forms() -> None:
    lists = generated_lists(GENERATED_LISTS)
    assert len(set(lists)) >= 100
    assert any("[0" in s for s in lists)  # zero padding
    assert any(re.search(r"\][^,\[]*\[", s) for s in lists)  # several bracket groups in a name
    assert any("," in s.split("[")[0] for s in lists)  # comma lists outside brackets
    assert any("-" in s.split("[")[0] for s in lists)  # names with dashes


def test_expand_agrees_with_scontrol_on_generated_lists(scontrol_env) -> None:
    for nodelist in generated_lists(GENERATED_LISTS):
        assert hostlist.expand(nodelist) == scontrol_hostnames(nodelist, scontrol_env), nodelist


@pytest.mark.parametrize(
    "nodelist",
    [
        "nid0[0001-0003,0007]",
        "gpu-[1-2]-[01-04]",
        "node1,node3,node[10-11]",
        "a[9-11]",
        "x-1[1-2]-y[3-4]",
        "n[1,1]",
        "single",
    ],
)
def test_expand_agrees_with_scontrol_on_known_lists(nodelist, scontrol_env) -> None:
    assert hostlist.expand(nodelist) == scontrol_hostnames(nodelist, scontrol_env)


def test_known_expansions() -> None:
    assert hostlist.expand("nid0[0001-0003,0007]") == [
        "nid00001",
        "nid00002",
        "nid00003",
        "nid00007",
    ]
    assert hostlist.expand("gpu-[1-2]-[01-02]") == ["gpu-1-01", "gpu-1-02", "gpu-2-01", "gpu-2-02"]
    assert hostlist.expand(" node2,node1 ") == ["node2", "node1"]  # Slurm's order, not sorted


def test_compress_round_trips_generated_lists() -> None:
    for nodelist in generated_lists(GENERATED_LISTS):
        names = sorted(set(hostlist.expand(nodelist)))
        assert sorted(hostlist.expand(hostlist.compress(names))) == names, nodelist


def test_compress_is_compact() -> None:
    assert hostlist.compress(["nid00003", "nid00001", "nid00002"]) == "nid[00001-00003]"
    assert hostlist.compress(["node1", "node2", "login"]) == "login,node[1-2]"


@pytest.mark.parametrize("bad", ["", "   ", "node[1-2", "node[2-1]", "node]1["])
def test_bad_lists_raise_launch_error(bad) -> None:
    with pytest.raises(LaunchError, match="node list"):
        hostlist.expand(bad)
