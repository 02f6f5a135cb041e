"""A stand-in task that moves a known number of bytes and uses CPU and memory (no TensorFlow).

A PS accepts connections on its port and reads each to the end, forever. A worker sends
TRAFFIC_BYTES bytes to every PS, holds ALLOC_MB of memory, runs a child that burns CPU for
BURN_SECONDS (and reaps it), then stays HOLD_SECONDS before it exits 0.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]
print(f"{job}:{index} starting", flush=True)


def drain(connection: socket.socket) -> None:
    total = 0
    while chunk := connection.recv(1 << 16):
        total += len(chunk)
    connection.close()
    print(f"received {total}", flush=True)


if job == "ps":
    host, port = config["cluster"]["ps"][index].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    while True:
        connection, _ = server.accept()
        threading.Thread(target=drain, args=(connection,), daemon=True).start()

ballast = bytearray(int(os.environ.get("ALLOC_MB", "0")) * 1024 * 1024)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1  # touch every page so it is resident
burn = float(os.environ.get("BURN_SECONDS", "0"))
if burn:
    code = f"import time\nend = time.process_time() + {burn}\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
payload = b"x" * (1 << 16)
size = int(os.environ.get("TRAFFIC_BYTES", "0"))
for address in config["cluster"].get("ps", []):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        left = size
        while left > 0:
            left -= connection.send(payload[: min(left, len(payload))])
print(f"sent {size}", flush=True)
time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
print("done", flush=True)
