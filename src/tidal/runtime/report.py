"""Reports from the workers to whoever runs the job: training metrics and goodput.

``tidal.log_metrics(loss=..., accuracy=...)`` never waits on the network: values are
buffered in memory and a background thread flushes them about once a second, in one batch
per flush, into the job's store (a :class:`~tidal.runtime.rendezvous.ReportQueue` under
``tidal/report/``). The launcher drains that queue and hands the batches on (the local
backend's agent to the controller, which stores the metrics for ``GET /jobs/{id}/metrics``).
The same batches carry the latest goodput report of the adaptive batch size (fitted
throughput model, noise scale, chosen batch, efficiency); only the newest one is kept.

Alone (no launcher, no store) nothing is sent: the values go to the ``tidal.metrics``
logger at DEBUG level.

A batch is JSON ``{"worker": id, "metrics": [{"step", "time", "rank", "values"}], "goodput":
{...} or null}``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from tidal.runtime.context import current
from tidal.runtime.env import ENV_STORE, ENV_WORKER_ID
from tidal.runtime.rendezvous import ReportQueue, connect_store

log = logging.getLogger("tidal.metrics")

#: Key prefix of the workers' report queue in the job's store.
REPORT_PREFIX = "tidal/report/"
#: Seconds between flushes: reports are for people and policies, not for the step.
FLUSH_INTERVAL = 1.0
#: Metrics kept in memory while the store cannot be reached; the oldest are dropped.
MAX_BUFFERED = 10_000


class Reporter:
    """The buffer and its flushing thread (one per process; see :func:`reporter`)."""

    def __init__(self, address: str | None, worker_id: str) -> None:
        self.address = address
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._metrics: list[dict[str, Any]] = []
        self._goodput: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: ReportQueue | None = None
        #: Batches written to the store so far (for tests and curiosity).
        self.flushed = 0

    def log(self, step: int, rank: int, values: Mapping[str, float]) -> None:
        """Buffer one step's metrics."""
        record = {"step": step, "time": time.time(), "rank": rank, "values": dict(values)}
        if self.address is None:
            log.debug("step %d: %s", step, record["values"])
            return
        with self._lock:
            self._metrics.append(record)
            if len(self._metrics) > MAX_BUFFERED:
                del self._metrics[: len(self._metrics) - MAX_BUFFERED]
        self._ensure_thread()

    def set_goodput(self, report: Mapping[str, Any]) -> None:
        """Replace the goodput report sent with the next batch."""
        if self.address is None:
            log.debug("goodput: %s", dict(report))
            return
        with self._lock:
            self._goodput = dict(report)
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="tidal-report", daemon=True)
            self._thread.start()
        # Flush what is left at exit; registered after tidal.init()'s own hook, so it runs
        # before the context closes.
        atexit.register(self.close)

    def _take(self) -> str | None:
        with self._lock:
            metrics, self._metrics = self._metrics, []
            goodput, self._goodput = self._goodput, None
        if not metrics and goodput is None:
            return None
        return json.dumps({"worker": self.worker_id, "metrics": metrics, "goodput": goodput})

    def flush(self) -> bool:
        """Send what is buffered now (from the reporting thread); ``False`` on failure."""
        batch = self._take()
        if batch is None:
            return True
        try:
            if self._queue is None:
                assert self.address is not None
                host, _, port = self.address.rpartition(":")
                store: dist.Store = connect_store(host, int(port), timeout=10.0)
                self._queue = ReportQueue(store, REPORT_PREFIX)
            self._queue.push(batch)
        except Exception as exc:  # the launcher may be gone; reports are best effort
            log.debug("report not sent: %s", exc)
            self._queue = None
            return False
        self.flushed += 1
        return True

    def _run(self) -> None:
        # Its own store connection: a TCPStore client is not meant to be shared by threads.
        while not self._stop.is_set():
            self._wake.wait(FLUSH_INTERVAL)
            self._wake.clear()
            self.flush()
        self.flush()

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is buffered and stop the thread (bounded)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._stop.set()
        self._wake.set()
        # A daemon thread caught inside a store call at interpreter exit aborts the process.
        thread.join(timeout)


_reporter: Reporter | None = None
_reporter_lock = threading.Lock()


def reporter() -> Reporter:
    """This process's reporter, created on first use from the launcher's environment."""
    global _reporter
    with _reporter_lock:
        if _reporter is None:
            _reporter = Reporter(
                os.environ.get(ENV_STORE) or None,
                os.environ.get(ENV_WORKER_ID, f"w{os.getpid()}"),
            )
        return _reporter


def log_metrics(*, step: int | None = None, all_ranks: bool = False, **values: Any) -> None:
    """Report training metrics, e.g. ``tidal.log_metrics(loss=0.31, accuracy=0.9)``.

    Non-blocking: values are buffered and sent about once a second. ``step`` defaults to
    the job's committed step count. Only rank 0 reports unless ``all_ranks`` (each record
    carries its rank). Values must convert to ``float`` (numbers, one-element tensors).
    """
    context = current()
    if context.rank != 0 and not all_ranks:
        return
    numbers = {name: float(value) for name, value in values.items()}
    reporter().log(context.step if step is None else int(step), context.rank, numbers)
