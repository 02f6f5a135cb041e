"""Host-name look-ups are bounded (issue 39): ``validate`` (and the local backend's check of
its hosts) looks every name up at once under one deadline and names the ones the resolver did
not answer for, instead of waiting out a slow resolver's timeout per name in turn.

The resolver is faked at its boundary (``socket.getaddrinfo``): a name ``slow-*`` gets no
answer for 30 s, as from a DNS server that does not reply; ``gone-*`` does not exist."""

from __future__ import annotations

import re
import socket
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from tests.helpers import FAKE_TASK, write_cluster
from tflaunch.cli import cli
from tflaunch.runtime import procs


@pytest.fixture
def resolver(monkeypatch):
    """The fake resolver; its ``asked`` counts look-ups by name. Released at the end, so that
    no look-up outlives the test."""
    real = socket.getaddrinfo
    released = threading.Event()
    asked: dict[str, int] = {}

    def getaddrinfo(host, *args, **kwargs):
        asked[host] = asked.get(host, 0) + 1
        if host.startswith("slow-"):
            released.wait(30)
        if host.startswith(("slow-", "gone-")):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked
    released.set()


@pytest.mark.timeout(60)  # serially, the look-ups would take 30 min
def test_a_hundred_names_cost_one_deadline_and_the_slow_ones_are_named(resolver, monkeypatch):
    monkeypatch.setattr(procs, "RESOLVE_DEADLINE_S", 1.0)
    names = [f"slow-{i}" for i in range(60)] + [f"gone-{i}" for i in range(40)] + ["localhost"]
    begun = time.monotonic()
    problems = procs.unresolved(names + names[:10], "fix it")
    took = time.monotonic() - begun
    assert resolver == dict.fromkeys(names, 1)  # every name once, however often it is given
    gone = [p for p in problems if "does not resolve" in p]
    assert gone == [f"host 'gone-{i}' does not resolve on this machine; fix it" for i in range(40)]
    (slow,) = [p for p in problems if "did not answer" in p]
    assert slow.startswith(
        "the resolver did not answer within 1 s for 60 host name(s): 'slow-0', 'slow-1', "
        "'slow-2', 'slow-3', 'slow-4' and 55 more; check the DNS servers in /etc/resolv.conf"
    ), slow
    assert took < 10.0, f"{took:.1f} s"  # serially: 60 x 30 s


@pytest.mark.timeout(60)
def test_validate_of_a_hundred_slow_host_names_is_out_within_ten_seconds(tmp_path, resolver):
    hosts = ["localhost"] + [{"name": f"slow-{i}.example"} for i in range(100)]
    path = write_cluster(
        tmp_path / "c.yaml",
        {"argv": [sys.executable, str(FAKE_TASK)]},
        hosts=hosts,
        roles={"ps": 1, "worker": 100},
    )
    begun = time.monotonic()
    result = CliRunner().invoke(cli, ["validate", str(path)])
    took = time.monotonic() - begun
    assert result.exit_code == 2, result.output
    found = re.search(
        r"the resolver did not answer within 5 s for (\d+) host name\(s\)", result.output
    )
    assert found and int(found.group(1)) >= 99, result.output  # the hosts that got tasks
    assert "Traceback" not in result.output
    assert took < 10.0, f"validate took {took:.1f} s"  # serially: 100 x 30 s
