"""A ``tf`` replica that proves its cluster is reachable: ``python tf_mesh.py OUT``.

It reads ``TF_CONFIG``, listens on its own address there (answering every connection with
its name, ``<type>-<index>``), connects to every other address of the cluster spec
(retrying until they listen) and writes what it reached to ``OUT/<type>-<index>.json``:
``{"me": address, "cluster": {...}, "reached": {address: name}}``. The chief then waits
until every replica has written and exits 0; the others keep answering until stopped.
Exits 4 when something is not there within 60 seconds. No TensorFlow needed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

DEADLINE = time.monotonic() + 60

out = Path(sys.argv[1])
config = json.loads(os.environ["TF_CONFIG"])
cluster: dict[str, list[str]] = config["cluster"]
kind, index = config["task"]["type"], int(config["task"]["index"])
name = f"{kind}-{index}"
me = cluster[kind][index]
host, _, port = me.rpartition(":")

server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((host, int(port)))
server.listen(16)
print(f"{name} listening on {me}", flush=True)


def answer() -> None:
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(f"{name}\n".encode())


threading.Thread(target=answer, daemon=True).start()


def reach(address: str) -> str:
    """The name of the replica listening at ``address``, once it listens."""
    peer_host, _, peer_port = address.rpartition(":")
    while True:
        try:
            with socket.create_connection((peer_host, int(peer_port)), timeout=5) as conn:
                return conn.makefile().readline().strip()
        except OSError:
            if time.monotonic() > DEADLINE:
                print(f"{name}: {address} never answered", flush=True)
                sys.exit(4)
            time.sleep(0.1)


reached = {}
for addresses in cluster.values():
    for address in addresses:
        if address != me:
            reached[address] = reach(address)
            print(f"{name} reached {reached[address]} at {address}", flush=True)

out.mkdir(parents=True, exist_ok=True)
tmp = out / f".{name}.tmp"
tmp.write_text(json.dumps({"me": me, "cluster": cluster, "reached": reached}))
tmp.replace(out / f"{name}.json")

total = sum(len(a) for a in cluster.values())
while kind == "chief" and len(list(out.glob("*.json"))) < total:
    if time.monotonic() > DEADLINE:
        sys.exit(4)
    time.sleep(0.05)
if kind == "chief":
    sys.exit(0)
while True:
    time.sleep(1)
