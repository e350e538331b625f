"""A standby agent: a job's agent started ahead of its job, its pool already warm.

A new job's agent spawned for it pays for an interpreter and the launch layer's imports
(torch, ``torch.distributed``), and its first workers each pay for theirs: seconds each,
tens of seconds on a loaded host, while the slots they were given stay idle. The local
backend keeps one standby instead (``backends/local_standby.py``):
``python -m tidal.launch.standby N STATE_DIR [MODULE ...]`` imports all the agent needs,
starts a :class:`~tidal.launch.warm.WarmSpawner` of ``N`` interpreters (each importing
torch and each ``MODULE``, in the server's environment, a few at a time:
:mod:`tidal.launch.import_turns`) and waits on its stdin.

The backend hands it a job by writing the path of the job's ``<job>.launch.json`` as one
line. The standby then moves its output to ``<job>.agent.log``, lets go of its stdin and
serves the job exactly as an agent spawned for it (:func:`tidal.launch.agent.serve`): the
same record, final status and store protocol; its ``TIDAL_AGENT_TREE`` token is the one it
was started with, which its pool's interpreters carry too. The job's first workers start
from the pool; once they train, the job's own plan decides how many interpreters it keeps
(:mod:`tidal.launch.warm_plan`). Its stdin closing before any job came (the server ended,
or died) ends it and its pool.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

from tidal.launch.agent import serve
from tidal.launch.agent_config import AgentConfig
from tidal.launch.file_modes import private_files
from tidal.launch.import_turns import ImportTurns
from tidal.launch.warm import WarmSpawner

__all__ = ["agent_log", "main"]

log = logging.getLogger("tidal.standby")

#: How long the standby waits for its pool's imports before saying how many are done.
_WARM_WAIT_S = 600.0


def agent_log(state_dir: Path, job_id: str) -> Path:
    """Where a job's agent writes its output (spawned or a standby)."""
    return state_dir / f"{job_id}.agent.log"


def _move_output(path: Path) -> None:
    """From now on this process's stdout and stderr append to ``path``; stdin reads
    nothing (the backend's pipe is let go of: the job outlives the server)."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _say_when_warm(pool: WarmSpawner) -> None:
    """Log once the pool's interpreters have done their imports (or the wait ends)."""
    warm = pool.wait_warm(_WARM_WAIT_S)
    log.info("standby: %d of %d interpreter(s) warm", warm, pool.size)


def main(argv: list[str] | None = None) -> int:
    """``python -m tidal.launch.standby SIZE STATE_DIR [MODULE ...]``: wait for a job,
    then serve it."""
    parser = argparse.ArgumentParser(description="tidal standby agent")
    parser.add_argument("size", type=int)
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("preload", nargs="*", help="modules the interpreters import ahead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with private_files():
        # Refilled only once the job it serves trains, by the job's own plan. Its
        # interpreters import in turns: they start beside jobs that train.
        turns = ImportTurns.for_host(args.state_dir / "import-turns")
        pool = WarmSpawner(args.size, preload=args.preload, refill=False, turns=turns)
        log.info("standby: %d warm interpreter(s); waiting for a job", args.size)
        threading.Thread(target=_say_when_warm, args=(pool,), daemon=True).start()
        line = sys.stdin.readline().strip()
        if not line:
            pool.close()  # no job will come: the backend closed, or its server died
            return 0
        # Its interpreters are the job's now: those its first workers do not take are the
        # job's pool for its next newcomer, which may come seconds after it trains.
        pool.end_turns()
        config = AgentConfig.from_json(Path(line).read_text())
        _move_output(agent_log(args.state_dir, config.job_id))
        log.info("job=%s: started by a standby agent with a warm pool", config.job_id)
        return serve(config, args.state_dir, pool=pool)


if __name__ == "__main__":
    sys.exit(main())
