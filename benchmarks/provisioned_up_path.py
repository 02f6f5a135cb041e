"""Follow a provisioned ``up`` call by call and count the modules it passes through and the
hand-offs between them (issue 30: "a provisioned up passes through 17 modules and comes back to one
it already left 44 times").

The scenario is the one of tests/cloud/test_ssh_provision.py's
``test_a_provisioned_up_plans_twice_and_writes_the_plan_once``: ``launch.up`` of an
``ssh.provision`` file (3 instances, ``up --down``) against moto's EC2 server, the instances'
addresses mapped to a local listener that only greets like sshd, so the path runs through the
cost table, creation, waiting, the plan on the real addresses, the SSH backend's launch, its
connect (which fails there: no real sshd) and the termination of the instances.

Every tflaunch module is imported before the trace starts (so that module bodies do not count).
A profile hook on the main thread records every call from one tflaunch module into another.
Counted:

- modules: the distinct tflaunch modules the path runs code of;
- hand-offs: the distinct (caller module, called module) pairs, i.e. the edges of the path's
  call graph between modules;
- back to a module already left: of those edges, the ones into a module that the path had
  entered and returned from before the first call along that edge, the small helper modules
  that everything uses (text, errors, the schema reader, run files) aside;
- back up the stack: edges into a module that still has a frame further up the stack (a call
  that re-enters a module the path is inside of: a callback or lambda going back up a layer).

The same script runs on the tree before the change and after it; both numbers are in the commit
that added it.

Usage: python benchmarks/provisioned_up_path.py   (needs boto3 and moto[server])
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path

HELPERS = (
    "tflaunch.text",
    "tflaunch.errors",
    "tflaunch.cluster.schema",
    "tflaunch.runtime.runfiles",
)


def banner_listener() -> int:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            conn.sendall(b"SSH-2.0-banner-only\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def main() -> None:
    from moto.server import ThreadedMotoServer

    tmp = Path(tempfile.mkdtemp())
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp / "c"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "s"),
    }.items():  # fmt: skip
        os.environ[key] = value
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    banner = banner_listener()
    names = ["worker-1", "worker-2", "ps-1"]
    (tmp / "map.json").write_text(
        json.dumps({n: {"connect": "127.0.0.1", "address": "127.0.0.1"} for n in names})
    )
    os.environ["TFLAUNCH_EC2_ADDRESS_MAP"] = str(tmp / "map.json")
    text = (
        "program: [python, train.py]\nbackend: ssh\n"
        f"runs_dir: {tmp / 'runs'}\nroles: {{ps: 1, worker: 2}}\nplacement: {{ps: dedicated}}\n"
        f"ssh:\n  port: {banner}\n  connect_timeout: 2\n  provision:\n    image: ami-12c6146b\n"
        "    region: us-east-1\n    ssh_from: 198.51.100.7/32\n    ps_instance_type: c5.xlarge\n"
        f"    worker_instance_type: p3.2xlarge\n    ready_timeout: 20\n"
        f"    endpoint_url: http://{host}:{port}\n"
    )
    from tflaunch import launch
    from tflaunch.cluster.config import parse_config
    from tflaunch.errors import TflaunchError
    from tflaunch.launchers.base import LaunchOptions

    config = parse_config(text, source=str(tmp / "c.yaml"), base_dir=str(tmp))
    import importlib
    import pkgutil

    import tflaunch.cluster
    import tflaunch.launchers
    import tflaunch.runtime

    for package in (tflaunch.cluster, tflaunch.runtime, tflaunch.launchers):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not any(part in info.name for part in (".models", "sitecustomize", "__main__")):
                importlib.import_module(info.name)
    seen: set[str] = set()  # modules entered so far
    edges: dict[tuple[str, str], bool] = {}  # (caller, callee) -> callee had been left before
    upward: set[tuple[str, str]] = set()  # (caller, callee) with callee still on the stack
    depth: dict[str, int] = {}  # frames of each module on the stack

    def hook(frame, event, _arg):  # noqa: ANN001, ANN202
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("tflaunch"):
            return
        if event == "call":
            caller = frame.f_back
            while caller is not None and not caller.f_globals.get("__name__", "").startswith(
                "tflaunch"
            ):
                caller = caller.f_back
            source = caller.f_globals["__name__"] if caller is not None else ""
            if source and source != module and (source, module) not in edges:
                edges[(source, module)] = module in seen and not depth.get(module)
            if source and source != module and depth.get(module) and module not in HELPERS:
                upward.add((source, module))
            seen.add(module)
            depth[module] = depth.get(module, 0) + 1
        elif event == "return":
            depth[module] = depth.get(module, 1) - 1

    sys.setprofile(hook)
    try:
        launch.up(config, str(tmp / "c.yaml"), options=LaunchOptions(down_at_end=True))
    except TflaunchError as err:
        outcome = str(err).splitlines()[0]
    finally:
        sys.setprofile(None)
        server.stop()
    back = [edge for edge, left in edges.items() if left and edge[1] not in HELPERS]
    print(f"outcome: {outcome}")
    print(f"modules: {len(seen)}")
    print(f"hand-offs (distinct caller -> called module pairs): {len(edges)}")
    print(f"  of which into a module already left (helpers aside): {len(back)}")
    print(f"  back up the stack into a module the path is inside of: {len(upward)}")
    for a, b in sorted(upward):
        print(f"    {a} -> {b}")
    print("modules passed through:\n  " + "\n  ".join(sorted(seen)))
    print("back to a module already left:\n  " + "\n  ".join(f"{a} -> {b}" for a, b in back))


if __name__ == "__main__":
    main()
