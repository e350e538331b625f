"""The SDK's client: one connection to a tidal server and the verbs on its jobs and cluster.

>>> from tidal.client import Client
>>> with Client() as c:                      # finds the local server through its data dir
...     job = c.submit("job.yaml")
...     c.wait(job.id, timeout=3600)
"""

from __future__ import annotations

import builtins
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tidal.client.account_verbs import AccountVerbs
from tidal.client.errors import (
    AuthError,
    ClientError,
    Conflict,
    InvalidRequest,
    NotFound,
    ServerUnavailable,
    problems,
)
from tidal.client.registry import RegistryVerbs
from tidal.client.worker_verbs import WorkerVerbs
from tidal.spec import JobSpec
from tidal.wire.cluster import ClusterView, HostView, TeamQueueView
from tidal.wire.discovery import (
    SOURCE_HEADER,
    default_data_dir,
    read_login,
    read_server_info,
    read_token,
)
from tidal.wire.schema import (
    AllocationView,
    EventView,
    JobDetail,
    JobView,
    LoginLinkView,
    MetricsView,
    Submitted,
)

__all__ = ["TERMINAL_STATES", "Client"]

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
#: Jobs asked for per listing page (the server's most).
_PAGE = 1000


class Client(WorkerVerbs, RegistryVerbs, AccountVerbs):
    """A connection to a tidal server.

    ``url`` and ``token`` default to ``$TIDAL_URL`` / ``$TIDAL_TOKEN``, then to what the
    server wrote into ``data_dir`` (default ``$TIDAL_DATA_DIR`` or ``~/.tidal``). The
    worker verbs (``launch_workers``, ``await_workers``, ``stop_workers``,
    ``list_workers``, ``run_cluster``) are :class:`~tidal.client.worker_verbs.WorkerVerbs`;
    the registry's (datasets, models, ``train``) :class:`~tidal.client.registry.RegistryVerbs`.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        data_dir: Path | str | None = None,
        timeout: float = 10.0,
        via: str = "api",
    ) -> None:
        folder = Path(data_dir) if data_dir is not None else default_data_dir()
        url = url or os.environ.get("TIDAL_URL")
        login = None
        if url is None:
            info = read_server_info(folder)
            login = None if info is not None else read_login()
            if info is None and login is None:
                raise ServerUnavailable(
                    f"no server found in {folder}; start one with `tidal server`, "
                    "or `tidal login` to one elsewhere"
                )
            url = info.url if info is not None else login.url  # type: ignore[union-attr]
        # The data dir's token belongs with the data dir's server; else what `tidal
        # login` stored (for the server it named).
        token = token or os.environ.get("TIDAL_TOKEN") or read_token(folder)
        if not token:
            login = login or read_login()
            if login is not None and login.url.rstrip("/") == url.rstrip("/"):
                token = login.token
        # ``via``: where the server's audit trail says changes come from (``cli``, ``api``).
        headers = {SOURCE_HEADER: via}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.url = url.rstrip("/")
        #: Names this client's launches: ``list_workers`` and a bare ``stop_workers()``
        #: read this session's workers, and workers see it as ``CDSW_MASTER_ID``.
        self.session = f"session-{uuid.uuid4().hex[:12]}"
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServerUnavailable(f"{self.url} did not answer within {self._timeout}s") from None
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"cannot reach {self.url}: {exc}") from None
        self._raise_for(response)
        return response

    @staticmethod
    def _raise_for(response: httpx.Response) -> None:
        if response.is_success:
            return
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        code = response.status_code
        if code == 401:
            raise AuthError("missing or invalid token", code)
        if code == 404:
            raise NotFound(str(detail), code)
        if code == 409:
            raise Conflict(str(detail), code)
        if code == 422:
            raise InvalidRequest(problems(detail))
        raise ClientError(f"HTTP {code}: {detail}", code)

    # -- jobs ---------------------------------------------------------------------------

    def submit(self, spec: JobSpec | Mapping[str, Any] | str | Path) -> Submitted:
        """Submit a job: a spec, a mapping, a path to a YAML file, or YAML text.

        A ``str`` without a newline is taken as a path. A Kubeflow manifest (TFJob,
        PyTorchJob, TrainJob) is accepted in each form: the server translates it, and the
        answer's ``warnings`` name each of its fields tidal cannot honour.
        """
        if isinstance(spec, JobSpec):
            response = self._request("POST", "/jobs", json=spec.model_dump(mode="json"))
        elif isinstance(spec, Mapping):
            response = self._request("POST", "/jobs", json=dict(spec))
        else:
            text = spec
            if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec):
                text = Path(spec).read_text(encoding="utf-8")
            response = self._request(
                "POST",
                "/jobs",
                content=str(text).encode(),
                headers={"Content-Type": "application/yaml"},
            )
        return Submitted.model_validate(response.json())

    def get(self, job: str) -> JobDetail:
        """A job by id (or the latest with that name), with its workers."""
        return JobDetail.model_validate(self._request("GET", f"/jobs/{job}").json())

    def list(
        self,
        state: str | Iterable[str] | None = None,
        name: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
        full: bool = False,
    ) -> builtins.list[JobView]:
        """Jobs in submission order, filtered by state(s), name and labels: up to ``limit``
        of them (all if ``None``), read page by page; with their specs if ``full``."""
        params: builtins.list[tuple[str, str]] = []
        states = [state] if isinstance(state, str) else builtins.list(state or [])
        params += [("state", s) for s in states]
        if name is not None:
            params.append(("name", name))
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        params.append(("view", "full" if full else "summary"))
        jobs: builtins.list[JobView] = []
        cursor: str | None = None
        while limit is None or len(jobs) < limit:
            page = min(_PAGE, limit - len(jobs)) if limit is not None else _PAGE
            asked = [*params, ("limit", str(page))]
            if cursor is not None:
                asked.append(("after", cursor))
            response = self._request("GET", "/jobs", params=asked)
            jobs += [JobView.model_validate(item) for item in response.json()]
            cursor = response.headers.get("x-next-cursor")
            if cursor is None:
                break
        return jobs

    def logs(self, job: str, tail: int = 100, worker: int | None = None) -> str:
        """The last ``tail`` lines of each worker's log, prefixed ``[worker]``."""
        params: dict[str, Any] = {"tail": tail}
        if worker is not None:
            params["worker"] = worker
        return self._request("GET", f"/jobs/{job}/logs", params=params).text

    def follow_logs(self, job: str, tail: int = 100, worker: int | None = None) -> Iterator[str]:
        """Log lines as they are written, until the job ends."""
        params: dict[str, Any] = {"tail": tail, "follow": True}
        if worker is not None:
            params["worker"] = worker
        # No read timeout: a quiet job may print nothing for minutes.
        timeout = httpx.Timeout(self._timeout, read=None)
        try:
            with self._http.stream(
                "GET", f"/jobs/{job}/logs", params=params, timeout=timeout
            ) as response:
                if not response.is_success:
                    response.read()
                    self._raise_for(response)
                yield from response.iter_lines()
        except httpx.TransportError as exc:
            raise ServerUnavailable(f"cannot reach {self.url}: {exc}") from None

    def priority(self, job: str, priority: int) -> JobView:
        """Set the job's priority."""
        response = self._request("PUT", f"/jobs/{job}/priority", json={"priority": priority})
        return JobView.model_validate(response.json())

    def scale(self, job: str, workers: int, role: str | None = None) -> JobView:
        """Ask for exactly ``workers`` workers; with ``role`` (the job's elastic role),
        ``workers`` replicas of that role, the fixed roles keeping theirs."""
        body: dict[str, Any] = {"workers": workers}
        if role is not None:
            body["role"] = role
        response = self._request("POST", f"/jobs/{job}/scale", json=body)
        return JobView.model_validate(response.json())

    def scale_out(self, job: str, count: int, timeout_s: float | None = None) -> JobView:
        """Grow by ``count``; rolled back after ``timeout_s`` if the job has not grown."""
        body: dict[str, Any] = {"count": count}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        response = self._request("POST", f"/jobs/{job}/scale-out", json=body)
        return JobView.model_validate(response.json())

    def scale_in(self, job: str, count: int) -> JobView:
        """Shrink by ``count``."""
        response = self._request("POST", f"/jobs/{job}/scale-in", json={"count": count})
        return JobView.model_validate(response.json())

    def cancel(self, job: str) -> JobView:
        """Ask for the job to be cancelled (see :meth:`wait`)."""
        return JobView.model_validate(self._request("POST", f"/jobs/{job}/cancel").json())

    def wait(
        self,
        job: str,
        states: Iterable[str] = TERMINAL_STATES,
        timeout: float = 600.0,
        interval: float = 0.5,
    ) -> JobView:
        """Poll until the job is in one of ``states``; ``TimeoutError`` after ``timeout`` s."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            view = self.get(job)
            if view.state in wanted:
                return view
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job} still {view.state} after {timeout}s")
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    def report_metrics(self, job: str, step: int, values: Mapping[str, float]) -> None:
        """Record training metrics of ``step`` (for training curves)."""
        self._request("POST", f"/jobs/{job}/metrics", json={"step": step, "values": dict(values)})

    def metrics(self, job: str) -> builtins.list[MetricsView]:
        """The job's training metrics in step order."""
        data = self._request("GET", f"/jobs/{job}/metrics").json()
        return [MetricsView.model_validate(item) for item in data]

    # -- cluster ------------------------------------------------------------------------

    def events(
        self, job: str | None = None, limit: int = 1000, actor: str | None = None
    ) -> builtins.list[EventView]:
        """Events in time order, of one job or of all; with ``actor``, that user's
        changes only."""
        path = f"/jobs/{job}/events" if job and not actor else "/events"
        params: dict[str, Any] = {"limit": limit}
        if actor:
            params["actor"] = actor
            if job:
                params["job"] = job
        data = self._request("GET", path, params=params).json()
        return [EventView.model_validate(item) for item in data]

    def allocations(self, job: str | None = None) -> builtins.list[AllocationView]:
        """The allocation timeline, of one job or of all."""
        path = f"/jobs/{job}/allocations" if job else "/allocations"
        return [AllocationView.model_validate(i) for i in self._request("GET", path).json()]

    def cluster(self) -> ClusterView:
        """Hosts, slots and who holds them."""
        return ClusterView.model_validate(self._request("GET", "/cluster").json())

    def login_link(self) -> LoginLinkView:
        """A one-time link that logs a browser into the dashboard (good for one use, for a
        few minutes; the token is not in it)."""
        return LoginLinkView.model_validate(self._request("POST", "/login/links").json())

    def queues(self) -> builtins.list[TeamQueueView]:
        """Each team's queue (``tidal server --teams``); empty without teams."""
        data = self._request("GET", "/queues").json()
        return [TeamQueueView.model_validate(item) for item in data]

    def drain(self, host: str, deadline: float | None = None) -> HostView:
        """Drain ``host``: no new workers, and its jobs move off it at their next step
        boundary; with ``deadline`` (seconds from now), a job that cannot leave in place
        checkpoints before then."""
        body = {} if deadline is None else {"deadline": deadline}
        data = self._request("POST", f"/cluster/hosts/{host}/drain", json=body).json()
        return HostView.model_validate(data)

    def undrain(self, host: str) -> HostView:
        """Take a drained ``host`` back into service."""
        data = self._request("POST", f"/cluster/hosts/{host}/undrain").json()
        return HostView.model_validate(data)

    def preemption_notice(self, host: str, at: float) -> HostView:
        """Tell the server that ``host`` goes at ``at`` (seconds since the epoch): the
        hook a cloud integration calls on a spot or preemptible machine's notice."""
        data = self._request("POST", f"/cluster/hosts/{host}/notice", json={"at": at}).json()
        return HostView.model_validate(data)

    def health(self) -> bool:
        """Whether the server answers its health check."""
        try:
            return bool(self._request("GET", "/health").json().get("status") == "ok")
        except ClientError:
            return False
