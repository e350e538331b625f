"""Start a parameter-server job's processes on this machine (tests, examples, benchmarks).

Every process runs the same script, told its role by the environment contract of
:mod:`tidal.ps.config`; the scheduler's job kind will start the same processes on slots.
Processes are started by ``fork`` (the script runs as ``__main__`` in a child of this
process, which spares every child the import of torch) or ``exec`` (a fresh interpreter);
either way each is in its own session, writes to its own log, and is stopped by pid.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tidal.ps.config import ClusterSpec, PSConfig, Role

Start = Literal["fork", "exec"]


@functools.cache
def preload_for_fork() -> None:
    """Import, once, what every child would: the first optimizer a process builds pulls
    in ``torch._dynamo`` (seconds of CPU), which forked children then share."""
    import torch

    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    import zmq  # noqa: F401

    import tidal.ps.data  # noqa: F401


@dataclass
class RoleProcess:
    """One started process of the job."""

    role: str
    index: int
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code, or ``None`` while it runs."""
        if self.returncode is None:
            if self.popen is not None:
                self.returncode = self.popen.poll()
            else:
                with contextlib.suppress(ChildProcessError):
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds; the exit code or ``None``."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.returncode

    def signal(self, sig: int) -> None:
        """Send ``sig`` to this process (if it still runs)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def output(self) -> str:
        """What it has written so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class LocalCluster:
    """A parameter-server job of ``config.n_ps`` servers, elastic workers and an optional
    chief."""

    script: str
    config: PSConfig
    workdir: Path
    args: Sequence[str] = ()
    start: Start = "fork"
    env: dict[str, str] = field(default_factory=dict)
    servers: dict[int, RoleProcess] = field(default_factory=dict)
    workers: dict[str, RoleProcess] = field(default_factory=dict)
    chief: RoleProcess | None = None
    _restarts: int = 0

    def __post_init__(self) -> None:
        self.config.validate()
        self.workdir = Path(self.workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.address_dir = str(self.workdir / "addresses")

    def spec(self, role: Role, index: int, worker_id: str = "") -> ClusterSpec:
        """The cluster description a process gets (as environment variables)."""
        return ClusterSpec(
            role=role,
            index=index,
            config=self.config,
            worker_id=worker_id,
            address_dir=self.address_dir,
        )

    def start_servers(self) -> None:
        """Start every server."""
        for i in range(self.config.n_ps):
            self.start_server(i)

    def start_server(self, index: int) -> RoleProcess:
        """Start (or restart) server ``index``."""
        self._restarts += index in self.servers
        proc = self._spawn("ps", index, f"ps-{index}-{self._restarts}", self.spec("ps", index))
        self.servers[index] = proc
        return proc

    def start_worker(self, index: int, worker_id: str | None = None) -> RoleProcess:
        """Start a worker reading data stream ``index`` (its id defaults to ``worker-<index>``)."""
        worker_id = worker_id or f"worker-{index}"
        name = f"{worker_id}-{sum(w.startswith(worker_id) for w in self.workers)}"
        proc = self._spawn("worker", index, name, self.spec("worker", index, worker_id))
        self.workers[name] = proc
        return proc

    def start_chief(self) -> RoleProcess:
        """Start the job's chief (it evaluates and checkpoints; it is no worker)."""
        if self.chief is not None and self.chief.poll() is None:
            raise RuntimeError("start_chief: the job's chief is running already")
        self.chief = self._spawn("chief", 0, "chief", self.spec("chief", 0, "chief"))
        return self.chief

    def _spawn(self, role: Role, index: int, name: str, spec: ClusterSpec) -> RoleProcess:
        log = self.workdir / "logs" / f"{name}.log"
        environ = {**self.env, **spec.to_env()}
        argv = [self.script, *self.args]
        if self.start == "exec":
            with open(log, "ab") as out:
                popen = subprocess.Popen(
                    [sys.executable, *argv],
                    env={**os.environ, **environ},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            return RoleProcess(role, index, popen.pid, log, popen)
        preload_for_fork()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 1
            try:
                os.setsid()
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                os.environ.update(environ)
                sys.argv = list(argv)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                logging.basicConfig(
                    level=os.environ.get("TIDAL_LOG_LEVEL", "WARNING"),
                    stream=sys.stderr,
                    force=True,
                )
                try:
                    runpy.run_path(self.script, run_name="__main__")
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        return RoleProcess(role, index, pid, log)

    def wait_workers(self, timeout: float) -> dict[str, int | None]:
        """Wait until every started worker has exited (or ``timeout``); their exit codes."""
        deadline = time.monotonic() + timeout
        for proc in self.workers.values():
            proc.wait(max(0.0, deadline - time.monotonic()))
        return {name: proc.poll() for name, proc in self.workers.items()}

    def processes(self) -> list[RoleProcess]:
        """Every process started: workers, the chief, servers."""
        chief = [self.chief] if self.chief is not None else []
        return [*self.workers.values(), *chief, *self.servers.values()]

    def stop(self, grace: float = 15.0) -> None:
        """Stop every process: workers, the chief, then servers; SIGTERM then SIGKILL after
        ``grace``."""
        procs = self.processes()
        for proc in procs:
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            if proc.wait(max(0.0, deadline - time.monotonic())) is None:
                proc.signal(signal.SIGKILL)
                proc.wait(5)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
