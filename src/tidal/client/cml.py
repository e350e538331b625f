"""Cloudera ML's workers API on a tidal server, called as CML's documentation writes it.

>>> from tidal.client import cml as cdsw
>>> workers = cdsw.launch_workers(n=2, cpu=0.2, memory=0.5, code="print('Hello')")
>>> done = cdsw.await_workers(workers, wait_for_completion=True, timeout_seconds=60)
>>> cdsw.stop_workers(*[w["id"] for w in workers])      # or cdsw.stop_workers(): all

The module's functions share one :class:`~tidal.client.Client` (found as ``Client()``
finds its server; :func:`use` sets another), which is the "session" CML's workers belong
to: ``list_workers`` and a bare ``stop_workers()`` see the workers it launched. What
differs from the client's methods is CML's return values and defaults: ``launch_workers``
returns worker dicts, ``await_workers`` waits for completion unless told otherwise, a
``timeout_seconds`` of 0 waits without a limit, and its ``workers`` are the workers that
got where they were awaited, its ``failures`` the dicts of those that did not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tidal.client.sdk import Client

__all__ = ["await_workers", "launch_workers", "list_workers", "stop_workers", "use"]

_client: Client | None = None


def use(client: Client | None) -> None:
    """Send this module's calls through ``client`` (``None``: a ``Client()`` on first use)."""
    global _client
    _client = client


def _session() -> Client:
    global _client
    if _client is None:
        _client = Client()
    return _client


def launch_workers(
    n: int,
    cpu: float,
    memory: float,
    nvidia_gpu: int = 0,
    kernel: str = "python3",
    script: str = "",
    code: str = "",
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Start ``n`` workers of ``cpu`` CPUs and ``memory`` GiB each running ``script`` (a
    Python file, read from this process's folder) or else ``code`` (Python text); one
    dict per worker (``id``, ``status``, ...) as :func:`list_workers` shows it."""
    client = _session()
    ids = client.launch_workers(
        n, cpu, memory, nvidia_gpu, kernel, script=script, code=code, env=env or {}
    )
    answer = client.await_workers(ids, wait_for_completion=False, timeout_seconds=0)
    workers: list[dict[str, Any]] = answer["workers"]
    return workers


def list_workers() -> list[dict[str, Any]]:
    """Every worker this session launched, one dict each."""
    return _session().list_workers()


def await_workers(
    ids: str | Mapping[str, Any] | Iterable[str | Mapping[str, Any]],
    wait_for_completion: bool = True,
    timeout_seconds: float = 60,
) -> dict[str, list[dict[str, Any]]]:
    """Wait for the workers ``ids`` names (ids, or the dicts :func:`launch_workers` and
    :func:`list_workers` return) to exit successfully, or without
    ``wait_for_completion`` to run; at most ``timeout_seconds`` (0: no limit).

    Returns ``{"workers": [dicts of those that got there], "failures": [dicts of those
    that did not]}``."""
    limit = math.inf if timeout_seconds == 0 else timeout_seconds
    answer = _session().await_workers(
        ids, wait_for_completion=wait_for_completion, timeout_seconds=limit
    )
    failed = set(answer["failures"])
    return {
        "workers": [w for w in answer["workers"] if w["id"] not in failed],
        "failures": [w for w in answer["workers"] if w["id"] in failed],
    }


def stop_workers(*worker_id: str | Mapping[str, Any]) -> list[str]:
    """Stop the workers named; with none, every worker this session launched."""
    return _session().stop_workers(*worker_id)
