"""A replica of a multi-role test job: what it does depends on ``argv[1]``.

``tf OUT``        writes the TF_CONFIG it got to ``OUT/<role>-<index>.json``; the chief
                  exits 0 once every replica has written, the others run until stopped
``never OUT``     replica 1 exits 3, the others run until stopped
``exitcode OUT``  the first run kills itself with SIGKILL, the next one exits 1
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

mode, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
role = os.environ["TIDAL_ROLE"]
index = int(os.environ["TIDAL_REPLICA_INDEX"])
print(f"{role}-{index} started", flush=True)
if mode == "tf":
    (out / f"{role}-{index}.json").write_text(os.environ["TF_CONFIG"])
    if role == "chief":
        deadline = time.monotonic() + 120
        while len(list(out.glob("*.json"))) < int(sys.argv[3]):
            if time.monotonic() > deadline:
                sys.exit(4)
            time.sleep(0.05)
        sys.exit(0)
elif mode == "never" and index == 1:
    sys.exit(3)
elif mode == "exitcode":
    marker = out / f"killed-{index}"
    if not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(1)
time.sleep(600)
