"""Generations of a job's membership, kept in a small key-value store.

The launcher (``tidal run``, later the controller's backend) hosts a ``TCPStore`` and is the
only writer of generations; workers read them. A generation ``g`` lists its members in rank
order and says why it exists. Each generation's process group lives under its own store
prefix, so a new group never sees keys of an old one.

Keys (all under ``tidal/``):

``gen``                  number of the latest published generation
``gen/<g>``              JSON :class:`Generation`
``ready/<worker>``       the worker has built its model and can be admitted
``arrive/<g>``           counter: members of ``g`` that reached its join barrier
``formed/<g>/<worker>``  the worker trains in ``g`` (state received)
``fault/<g>``            counter: members of ``g`` that saw a collective fail
``progress``             JSON ``{"step", "epoch", "gen", "world", "time"}`` from rank 0
``resize``               JSON ``{"workers": N, "seq": k}`` asked for by ``tidal resize``
``report/...``           a :class:`ReportQueue` of the workers' metrics and goodput reports
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tidal.runtime.env import ENV_STORE, ENV_WORKER_ID

PREFIX = "tidal/"

log = logging.getLogger("tidal.runtime")


class RendezvousTimeout(TimeoutError):
    """A wait on the store outlasted its bound."""


@dataclass(frozen=True)
class Generation:
    """One membership of the job; ``members`` are worker ids in rank order."""

    number: int
    members: tuple[str, ...]
    #: ``start``, ``resize``, ``failure``, ``restart`` or ``release``.
    reason: str = "resize"
    #: Workers of the previous generation that died (for ``failure``).
    lost: tuple[str, ...] = ()
    published_at: float = field(default_factory=time.time)

    def rank_of(self, worker_id: str) -> int | None:
        """The worker's rank in this generation, or ``None`` if it is not a member."""
        try:
            return self.members.index(worker_id)
        except ValueError:
            return None

    def to_json(self) -> str:
        """Serialise for the store."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> Generation:
        """Parse what :meth:`to_json` wrote."""
        data = json.loads(raw)
        return cls(
            number=int(data["number"]),
            members=tuple(data["members"]),
            reason=str(data.get("reason", "resize")),
            lost=tuple(data.get("lost", ())),
            published_at=float(data.get("published_at", 0.0)),
        )


def connect_store(host: str, port: int, *, timeout: float = 30.0) -> dist.TCPStore:
    """A client connection to a job's store."""
    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout), wait_for_workers=False
    )


@dataclass(frozen=True)
class WorkerStore:
    """Where a worker meets its job: the launcher's store at ``address`` (its
    ``TIDAL_STORE``), or, for a worker with no launcher, a private one hosted here
    (``local``), so that one code path serves both."""

    worker_id: str
    address: tuple[str, int]
    local: RendezvousHost | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerStore:
        """The launcher's store and this worker's id, from ``environ``; else a private
        store, the worker ``w0``."""
        address = environ.get(ENV_STORE)
        if not address:
            local = RendezvousHost()
            return cls("w0", (local.host, local.port), local)
        host, _, port = address.rpartition(":")
        return cls(environ.get(ENV_WORKER_ID, f"w{os.getpid()}"), (host, int(port)))

    def connect(self, timeout: float) -> dist.Store:
        """A connection of its own (a store client is not shared across threads); the
        private store itself."""
        if self.local is not None:
            return self.local.store
        return connect_store(*self.address, timeout=timeout)


class _StoreView:
    """Typed reads and writes of the ``tidal/`` keys over any ``dist.Store``."""

    def __init__(self, store: dist.Store) -> None:
        self.store = store

    def _has(self, key: str) -> bool:
        return bool(self.store.check([PREFIX + key]))

    def _get(self, key: str) -> bytes | None:
        if not self._has(key):
            return None
        return bytes(self.store.get(PREFIX + key))

    def _set(self, key: str, value: str) -> None:
        self.store.set(PREFIX + key, value)

    def _add(self, key: str, amount: int) -> int:
        return int(self.store.add(PREFIX + key, amount))

    def latest_number(self) -> int:
        """Number of the latest generation, -1 before the first."""
        # One round trip: the host writes ``gen`` when it starts, so it always exists
        # (this runs every watcher poll in every worker).
        return int(self.store.get(PREFIX + "gen"))

    def generation(self, number: int) -> Generation:
        """The record of generation ``number`` (which must be published)."""
        raw = self._get(f"gen/{number}")
        if raw is None:
            raise KeyError(f"generation {number} is not published")
        return Generation.from_json(raw)

    def latest(self) -> Generation | None:
        """The latest generation, or ``None`` before the first."""
        number = self.latest_number()
        return None if number < 0 else self.generation(number)

    def fault_count(self, number: int) -> int:
        """How many members of ``number`` reported a failed collective."""
        return self._add(f"fault/{number}", 0)

    def progress(self) -> dict[str, Any] | None:
        """The last progress report of rank 0, if any."""
        raw = self._get("progress")
        return None if raw is None else dict(json.loads(raw))


class RendezvousClient(_StoreView):
    """The worker side: announce readiness, find generations, meet at their barrier."""

    def __init__(self, store: dist.Store, worker_id: str) -> None:
        super().__init__(store)
        self.worker_id = worker_id

    def mark_ready(self) -> None:
        """Tell the launcher this worker is built and can be admitted."""
        self._set(f"ready/{self.worker_id}", "1")

    def report_fault(self, number: int) -> None:
        """Say that a collective of generation ``number`` failed here."""
        self._add(f"fault/{number}", 1)

    def mark_formed(self, number: int) -> None:
        """Say that this worker trains in generation ``number``."""
        self._set(f"formed/{number}/{self.worker_id}", "1")

    def report_progress(self, step: int, epoch: int, gen: int, world: int) -> None:
        """Publish rank 0's position, for launchers and ``--resize-at``."""
        self._set(
            "progress",
            json.dumps(
                {"step": step, "epoch": epoch, "gen": gen, "world": world, "time": time.time()}
            ),
        )

    def wait_for_generation(
        self, after: int, *, skip_foreign: bool, timeout: float | None, poll: float = 0.005
    ) -> Generation:
        """Block until a generation newer than ``after`` is published and return the
        newest. With ``skip_foreign``, keep waiting past generations that neither list this
        worker nor release everyone (an empty member list)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            number = self.latest_number()
            if number > after:
                generation = self.generation(number)
                if (
                    not skip_foreign
                    or self.worker_id in generation.members
                    or not generation.members
                ):
                    return generation
                after = number
            if deadline is not None and time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"worker {self.worker_id}: no new generation within {timeout:.1f}s"
                )
            time.sleep(poll)

    def barrier(self, generation: Generation, *, timeout: float, poll: float = 0.002) -> bool:
        """Wait until every member of ``generation`` arrived. Returns ``False`` as soon as a
        newer generation supersedes it (a member died on the way in)."""
        self._add(f"arrive/{generation.number}", 1)
        deadline = time.monotonic() + timeout
        while self._add(f"arrive/{generation.number}", 0) < len(generation.members):
            if self.latest_number() > generation.number:
                return False
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"generation {generation.number}: not every member arrived within "
                    f"{timeout:.1f}s"
                )
            time.sleep(poll)
        return True


class RendezvousHost(_StoreView):
    """The launcher side: hosts the store and publishes generations."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        store = dist.TCPStore(
            host,
            port,
            is_master=True,
            timeout=timedelta(seconds=30),
            wait_for_workers=False,
            use_libuv=True,
        )
        super().__init__(store)
        self.host = host
        self.port = int(store.port)
        self._set("gen", "-1")

    @property
    def address(self) -> str:
        """``host:port`` for workers' ``TIDAL_STORE``."""
        return f"{self.host}:{self.port}"

    def publish(self, generation: Generation) -> None:
        """Make ``generation`` the latest; its record is written before its number."""
        self._set(f"gen/{generation.number}", generation.to_json())
        self._set("gen", str(generation.number))

    def is_ready(self, worker_id: str) -> bool:
        """Whether the worker announced it can be admitted."""
        return self._has(f"ready/{worker_id}")

    def is_formed(self, number: int, worker_id: str) -> bool:
        """Whether the worker trains in generation ``number``."""
        return self._has(f"formed/{number}/{worker_id}")

    def resize_request(self) -> dict[str, Any] | None:
        """The latest ``tidal resize`` request, if any."""
        raw = self._get("resize")
        return None if raw is None else dict(json.loads(raw))


def request_resize(store: dist.Store, workers: int) -> int:
    """Ask the launcher owning ``store`` for ``workers`` workers; returns the request's
    sequence number."""
    view = _StoreView(store)
    seq = view._add("resize_seq", 1)
    view._set("resize", json.dumps({"workers": workers, "seq": seq}))
    return seq


class ReportQueue:
    """An append-only queue of text records in a store: any number of writers, one reader.

    Keys under ``prefix``: ``n`` counts the records reserved so far, ``r/<i>`` holds record
    ``i`` (1-based) until it is read, ``read`` how many the reader consumed. The cursor
    lives in the store, so a new reader (a restarted controller) resumes where the last
    one stopped, and read records are deleted, so the store does not grow.

    A writer reserves a number, then writes the record: the reader may see the number
    before the record. It waits for a missing record up to ``skip_after`` seconds, then
    skips it (its writer died in between).
    """

    def __init__(self, store: dist.Store, prefix: str, *, skip_after: float = 5.0) -> None:
        self.store = store
        self.prefix = prefix
        self.skip_after = skip_after
        self._read: int | None = None
        self._missing_since: float | None = None

    def push(self, record: str) -> None:
        """Append one record (one round trip to reserve it, one to write it)."""
        number = int(self.store.add(self.prefix + "n", 1))
        self.store.set(f"{self.prefix}r/{number}", record)

    def drain(self, limit: int = 1000) -> list[str]:
        """Records not read yet, oldest first (at most ``limit``); one round trip when
        there is nothing new."""
        total = int(self.store.add(self.prefix + "n", 0))
        if self._read is None:
            cursor = self.prefix + "read"
            self._read = int(self.store.get(cursor)) if self.store.check([cursor]) else 0
        start = self._read
        out: list[str] = []
        while self._read < total and len(out) < limit:
            key = f"{self.prefix}r/{self._read + 1}"
            if not self.store.check([key]):
                now = time.monotonic()
                if self._missing_since is None:
                    self._missing_since = now
                if now - self._missing_since < self.skip_after:
                    break
                log.debug("report %s never written: skipped", key)
            else:
                out.append(bytes(self.store.get(key)).decode())
                self.store.delete_key(key)
            self._read += 1
            self._missing_since = None
        if self._read != start:
            self.store.set(self.prefix + "read", str(self._read))
        return out
