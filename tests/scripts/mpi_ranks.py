"""One rank of an ``mpirun`` job: says who started it, and where.

Open MPI gives every rank ``OMPI_COMM_WORLD_RANK``/``_SIZE``; the rank writes them, its
host and pid to ``OUT/rank-N.json`` so a test can see that ``mpirun`` started one rank on
every slot of the host list the job's launcher role was given.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def main() -> None:
    """Write this rank's record."""
    out = Path(sys.argv[1])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    record = {
        "rank": rank,
        "size": int(os.environ["OMPI_COMM_WORLD_SIZE"]),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    tmp = out / f"rank-{rank}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, out / f"rank-{rank}.json")


if __name__ == "__main__":
    main()
