"""A TensorFlow-free stand-in for ``tflaunch.models.pss`` (ParameterServerStrategy), for tests
whose subject is the launcher (restarts, spot replacement), not TensorFlow: the same flags,
roles and lines, in milliseconds of CPU instead of seconds.

``ps`` and ``worker`` tasks listen on their cluster port and serve until they are stopped, as
``tf.distribute.Server(...).join()`` does. The ``chief`` waits until every server accepts
connections, counts global steps to ``--train_steps`` (``--step_delay`` seconds each), writes a
checkpoint (a file holding the step) every ``--checkpoint_steps`` steps and at the end, starts
from the newest one it finds (``resumed from ... at global step N``) and exits 0. With
``--hold_file PATH`` it goes on counting past ``--train_steps`` until PATH exists: a test
releases it once what it waits for has happened, instead of sizing the training to outlast it.
"""

import argparse
import json
import os
import socket
import time


def serve(address: str) -> None:
    host, port = address.rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    print("serving", flush=True)
    while True:
        connection, _ = server.accept()
        connection.close()


def wait_for(addresses: list, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    for address in addresses:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"chief: {address} never accepted a connection") from None
                time.sleep(0.1)


def newest_checkpoint(directory: str) -> tuple:
    steps = [
        int(name[len("ckpt-") :])
        for name in os.listdir(directory)
        if name.startswith("ckpt-") and name[len("ckpt-") :].isdigit()
    ]
    if not steps:
        return None, 0
    return os.path.join(directory, f"ckpt-{max(steps)}"), max(steps)


def run_chief(args: argparse.Namespace, cluster: dict) -> None:
    wait_for(cluster.get("ps", []) + cluster.get("worker", []))
    directory = args.checkpoint_dir or os.environ.get("TFLAUNCH_CHECKPOINT_DIR", "")
    restarts = os.environ.get("TFLAUNCH_CLUSTER_RESTARTS", "0")
    step = 0
    if directory:
        os.makedirs(directory, exist_ok=True)
        path, step = newest_checkpoint(directory)
        if path:
            print(f"resumed from {path} at global step {step} (cluster restarts: {restarts})")
        else:
            print(f"no checkpoint in {directory}: starting at global step 0")
    print(f"chief: training to global step {args.train_steps}", flush=True)
    saved = step

    def held() -> bool:
        return bool(args.hold_file) and not os.path.exists(args.hold_file)

    last = step >= args.train_steps and not held()
    while not last:
        time.sleep(args.step_delay)
        step += 1
        last = step >= args.train_steps and not held()
        if step % 10 == 0 or step == args.train_steps:
            print(f"global step {step}: loss {1.0 / step:.4f}", flush=True)
        if directory and (step - saved >= args.checkpoint_steps or last):
            path = os.path.join(directory, f"ckpt-{step}")
            with open(path, "w") as file:
                file.write(f"{step}\n")
            saved = step
            print(f"saved checkpoint {path} at global step {step}", flush=True)
    print(f"chief: done at global step {step}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_steps", type=int, default=100)
    parser.add_argument("--step_delay", type=float, default=0.0)
    parser.add_argument("--checkpoint_steps", type=int, default=50)
    parser.add_argument("--checkpoint_dir", default="")
    parser.add_argument("--hold_file", default="")
    args, _ = parser.parse_known_args()
    config = json.loads(os.environ["TF_CONFIG"])
    job, index = config["task"]["type"], config["task"]["index"]
    print(f"{job}:{index} restarts: cluster {os.environ.get('TFLAUNCH_CLUSTER_RESTARTS')}")
    if job == "chief":
        run_chief(args, config["cluster"])
    else:
        serve(config["cluster"][job][index])


if __name__ == "__main__":
    main()
