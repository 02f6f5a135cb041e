"""An agent ships its host's trace files and nothing a symlink in its trace directory points at
(issue 39: every path walk safe at every component): a link to a file or a folder of the
user's, planted by a task sharing the directory, is not sent to the coordinator."""

from __future__ import annotations

import json

from tflaunch.runtime import protocol
from tflaunch.trace.links import HostTrace


def test_the_agent_ships_its_files_and_no_symlinked_file_or_folder(tmp_path) -> None:
    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_text("PRIVATE KEY\n")
    wire: list[dict] = []
    host = HostTrace(
        tmp_path / "host2", lambda e: wire.append(json.loads(json.dumps(e.wire()))), []
    )
    raw = host.dir / "raw"
    raw.mkdir(parents=True)
    (raw / "h2.xplane.pb").write_bytes(b"profile")
    (raw / "key.xplane.pb").symlink_to(secret / "id_ed25519")
    (raw / "plugins").symlink_to(secret)
    host.collect(protocol.TraceCollect(to=str(tmp_path / "coordinator" / "trace")))
    assert host.ship()
    pieces = [e for e in wire if e["event"] == "trace_file"]
    assert [p["path"] for p in pieces] == ["raw/h2.xplane.pb"]
    assert wire[-1]["event"] == "trace_sent" and wire[-1]["files"] == ["raw/h2.xplane.pb"]
