"""The SDK's worker verbs: launch workers, wait for them, stop them, start a PS cluster.

Mixed into :class:`tidal.client.Client`, whose transport (``_request``) they use; they
import nothing of it. Workers are the replicas of an ordinary job (they
hold slots of the pool and are listed by ``tidal list``), named ``"<job id>/<worker
index>"``; the pure parts (ids, specs, summaries) are :mod:`tidal.client.workers`.
"""

from __future__ import annotations

import builtins
import math
import os
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidal.client.errors import InvalidRequest, NotFound
from tidal.client.workers import (
    ENDED_STATES,
    PYTHON_KERNELS,
    WorkerArgumentError,
    WorkerRef,
    argument_problems,
    launch_spec,
    launched,
    parse_worker_ids,
    summarise,
    unknown_worker,
)

if TYPE_CHECKING:
    import httpx

    from tidal.ps.config import Mode
    from tidal.wire.schema import JobDetail, JobView, Submitted

__all__ = ["ENV_MASTER_ID", "ENV_MASTER_IP", "SESSION_LABEL", "WorkerVerbs", "caller_address"]

#: The label naming the client session that launched a workers job: ``list_workers`` and a
#: bare ``stop_workers()`` read the jobs of their own session, as Cloudera ML's do.
SESSION_LABEL = "tidal.workers/session"
#: Cloudera ML's variables for the launching session's id and address (both names: CML
#: writes ``CML_``, the Data Science Workbench it grew from ``CDSW_``).
ENV_MASTER_ID = ("CDSW_MASTER_ID", "CML_MASTER_ID")
ENV_MASTER_IP = ("CDSW_MASTER_IP", "CML_MASTER_IP")

#: Job states after which nothing of a job runs.
_OVER = frozenset({"succeeded", "failed", "cancelled"})
#: The first and the longest pause between two looks at the workers' jobs.
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0


def _seconds(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise WorkerArgumentError(f"{argument}: expected seconds >= 0, got {value!r}")
    if value < 0:
        raise WorkerArgumentError(f"{argument}: expected seconds >= 0, got {value}")
    return float(value)


def caller_address(url: str) -> str:
    """This machine's address as ``url``'s server sees it: the local end of a route to it
    (nothing is sent), so a worker on another machine can reach the launching session."""
    import httpx

    target = httpx.URL(url)
    host = target.host or "127.0.0.1"
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _kernel(kernel: Any) -> None:
    if kernel not in PYTHON_KERNELS:
        raise WorkerArgumentError(f"kernel: tidal runs Python workers ('python3'), got {kernel!r}")


class WorkerVerbs:
    """``launch_workers``, ``await_workers``, ``stop_workers``, ``list_workers`` and
    ``run_cluster``, with Cloudera ML's signatures (and tidal's own keywords)."""

    if TYPE_CHECKING:
        url: str
        session: str

        def get(self, job: str) -> JobDetail: ...
        def cancel(self, job: str) -> JobView: ...
        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def _submit_spec(self, spec: Mapping[str, Any]) -> Submitted:
        """Submit ``spec``; a refusal names the verb's arguments rather than spec fields."""
        from tidal.wire.schema import Submitted

        try:
            response = self._request("POST", "/jobs", json=dict(spec))
        except InvalidRequest as exc:
            raise InvalidRequest(argument_problems(exc.problems)) from None
        return Submitted.model_validate(response.json())

    def launch_workers(
        self,
        n: int,
        cpu: float = 1.0,
        memory: float | str | None = None,
        nvidia_gpu: int = 0,
        kernel: str = "python3",
        script: str = "",
        code: str = "",
        env: Mapping[str, str] | None = None,
        *,
        gpus: int | None = None,
        command: str | Sequence[str] | None = None,
        role: str = "worker",
        name: str = "workers",
        working_dir: str | None = None,
    ) -> builtins.list[str]:
        """Start ``n`` workers and return their ids (``"<job id>/<index>"``).

        Cloudera ML's call: ``launch_workers(n, cpu, memory, nvidia_gpu=0,
        kernel="python3", script="", code="", env={})``, ``memory`` in GiB (a string
        like ``"512Mi"`` has its own unit), ``script`` a Python file or ``code`` Python
        text to run (``script`` wins when both are given); ``gpus`` is tidal's name for
        ``nvidia_gpu`` and ``command`` runs anything else (a string is split like a shell
        would). Relative paths are read from ``working_dir``, by default this process's
        folder (``os.getcwd()``), as ``tidal submit`` does.

        They are one job of ``n`` fixed replicas, each holding ``gpus`` slots of the pool
        (one when 0), each with ``env`` added to its environment and the launching
        session's id and address (``CDSW_MASTER_ID``, ``CDSW_MASTER_IP``; the launch
        layer adds each worker's own ``CDSW_ENGINE_ID`` and ``CDSW_IP_ADDRESS``, and its
        peers' ``TIDAL_PEER_ADDRESSES``). A worker that fails is not restarted: it is
        reported by :meth:`await_workers`, and its job fails (the others stop). A bad
        argument raises :class:`~tidal.client.workers.WorkerArgumentError` naming it, and
        nothing is submitted.
        """
        _kernel(kernel)
        if gpus is not None and nvidia_gpu not in (0, gpus):
            raise WorkerArgumentError(
                f"gpus/nvidia_gpu: two names for one count, got {gpus} and {nvidia_gpu}"
            )
        folder = os.path.abspath(working_dir if working_dir is not None else os.getcwd())
        # A bad ``env`` goes on as given: launch_spec names it.
        variables = {} if env is None else dict(env) if isinstance(env, Mapping) else env
        if isinstance(variables, dict):
            master_ip = caller_address(self.url)
            for key in ENV_MASTER_ID:
                variables.setdefault(key, self.session)
            for key in ENV_MASTER_IP:
                variables.setdefault(key, master_ip)
        spec = launch_spec(
            n,
            cpu=cpu,
            memory=memory,
            gpus=nvidia_gpu if gpus is None else gpus,
            # Cloudera ML's defaults are empty strings: "not given".
            script=script or None,
            command=command,
            code=code or None,
            env=variables,
            role=role,
            name=name,
            working_dir=folder,
            labels={SESSION_LABEL: self.session},
        )
        job = self._submit_spec(spec)
        return [str(WorkerRef(job.id, i)) for i in range(n)]

    def _jobs_of(self, refs: Sequence[WorkerRef], argument: str) -> dict[str, JobDetail]:
        """Each job ``refs`` name; :class:`NotFound` naming the id for an unknown one."""
        jobs: dict[str, JobDetail] = {}
        for i, ref in enumerate(refs):
            if ref.job not in jobs:
                try:
                    jobs[ref.job] = self.get(ref.job)
                except NotFound:
                    raise NotFound(
                        f"{argument}[{i}]: no job {ref.job!r} (worker {ref})", 404
                    ) from None
            problem = unknown_worker(ref, jobs[ref.job])
            if problem is not None:
                raise NotFound(f"{argument}[{i}]: {problem}", 404)
        return jobs

    def await_workers(
        self,
        ids: str | Iterable[str | Mapping[str, Any]] | Mapping[str, Any],
        wait_for_completion: bool = False,
        timeout_seconds: float = 60.0,
    ) -> dict[str, Any]:
        """Wait until every worker of ``ids`` runs (or, with ``wait_for_completion``, has
        exited), for at most ``timeout_seconds``. ``ids`` are ids, or the worker dicts
        :meth:`list_workers` and a wait return (Cloudera ML's form: see
        :mod:`tidal.client.cml` for its defaults and its answer).

        Returns ``{"workers": [{"id", "ip_address", "host", "slot", "status",
        "exit_code"}], "failures": [ids]}``: the failures are the workers that failed,
        were stopped, never started before their job ended, did not get there in time,
        or (with ``wait_for_completion``) exited with a status other than 0.
        """
        refs = parse_worker_ids(ids)
        limit = _seconds(timeout_seconds, "timeout_seconds")
        deadline = time.monotonic() + limit
        jobs = self._jobs_of(refs, "ids")
        pause = _FIRST_PAUSE
        while True:
            reports = summarise(refs, jobs, completion=wait_for_completion)
            left = deadline - time.monotonic()
            if all(r.settled for r in reports) or left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)
            waiting = {str(ref): ref.job for ref in refs}
            for job_id in {waiting[r.id] for r in reports if not r.settled}:
                jobs[job_id] = self.get(job_id)
        return {
            "workers": [r.as_dict() for r in reports],
            "failures": [r.id for r in reports if r.failed or not r.settled],
        }

    def stop_workers(
        self, *worker_id: str | Iterable[str] | Mapping[str, Any]
    ) -> builtins.list[str]:
        """Stop the workers named (Cloudera ML's ``stop_workers(*worker_id)``: ids, worker
        dicts, or lists of them); with none named, every worker this client launched that
        has not ended. Returns the ids of the jobs asked to stop some or all of their
        workers.

        A job whose every worker is named ends ``cancelled``. A job of which only some are
        named goes on without them: a fixed-size job (:meth:`launch_workers`) runs that
        many fewer from then on, an elastic one is scaled in by as many and gives up
        exactly their slots. The workers stop on the controller's next tick
        (:meth:`await_workers` with ``wait_for_completion`` waits for them; they end
        ``released``). Refused (:class:`~tidal.client.Conflict`, naming the id) for a
        worker that is not running, a replica of a multi-role job's fixed role (a
        parameter server, a chief) and an elastic job that would go below its minimum:
        nothing of that job is stopped (jobs named before it may be).
        """
        if not worker_id:
            return [job.id for job in self._session_jobs() if job.state not in _OVER]
        return self._stop(worker_id)

    def list_workers(self) -> builtins.list[dict[str, Any]]:
        """Every worker this client launched, as Cloudera ML's ``list_workers()``: one
        dict each as :meth:`await_workers` reports it (``id``, ``ip_address``, ``host``,
        ``slot``, ``status``, ``exit_code``), in launch order."""
        workers: builtins.list[dict[str, Any]] = []
        for job in self._session_jobs(cancel=False):
            known = {w.worker_id for w in job.worker_list}
            refs = {WorkerRef(job.id, i) for i in known | set(range(launched(job.spec)))}
            for report in summarise(sorted(refs), {job.id: job}, completion=False):
                workers.append(report.as_dict())
        return workers

    def _session_jobs(self, cancel: bool = True) -> builtins.list[JobDetail]:
        """The jobs :meth:`launch_workers` of this client submitted, oldest first; with
        ``cancel``, those still going are asked to stop."""
        views = self.list(labels={SESSION_LABEL: self.session})  # type: ignore[attr-defined]
        jobs = [self.get(v.id) for v in views]
        if cancel:
            for job in jobs:
                if job.state not in _OVER:
                    self.cancel(job.id)
        return jobs

    def _stop(self, ids: Any) -> builtins.list[str]:
        from tidal.wire.schema import JobView

        refs = parse_worker_ids(ids)
        jobs = self._jobs_of(refs, "ids")
        whole: builtins.list[str] = []
        some: dict[str, builtins.list[int]] = {}
        for job_id, job in jobs.items():
            if job.state in _OVER:
                continue  # nothing of it runs any more
            named = {r.index for r in refs if r.job == job_id}
            ended = {w.worker_id for w in job.worker_list if w.state in ENDED_STATES}
            known = {w.worker_id for w in job.worker_list} | set(range(job.max_slots))
            if known - ended - named:
                some[job_id] = sorted(named - ended)
            else:
                whole.append(job_id)
        # The stops the server may refuse go first: a refusal then cancels nothing.
        for job_id, workers in some.items():
            if workers:
                response = self._request(
                    "POST", f"/jobs/{job_id}/workers/stop", json={"workers": workers}
                )
                JobView.model_validate(response.json())
        for job_id in whole:
            self.cancel(job_id)
        return [*whole, *(j for j, w in some.items() if w)]

    def run_cluster(
        self,
        n_workers: int,
        n_ps: int,
        cpu: float = 1.0,
        memory: int | str | None = None,
        worker_script: str | None = None,
        mode: Mode = "async",
        *,
        replicas_to_aggregate: int | None = None,
        max_staleness: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        gpus: int = 0,
        name: str = "ps",
        timeout_seconds: float = 60.0,
        chief: bool = False,
    ) -> dict[str, Any]:
        """Start a parameter-server job (see :mod:`tidal.client.ps_cluster`) and wait up to
        ``timeout_seconds`` for its processes to run.

        Returns its cluster spec: ``{"job", "mode", "ps": [ids], "workers": [ids],
        "addresses": {id: ip}, "failures": [ids]}`` (ids as :meth:`await_workers` takes
        them; a process not running in time is in ``failures``). The job succeeds when
        every worker exited 0; its servers are then stopped (they show ``released``), so
        wait for ``cluster["workers"]`` to complete, not for the servers. With ``chief``
        the job has a ``chief`` too (``"chief": [id]``; ``[]`` without): the job succeeds
        on its success, so wait for the chief.
        """
        from tidal.client.ps_cluster import CHIEF_ROLE, PS_ROLE, cluster_job_spec

        if worker_script is None:
            raise WorkerArgumentError("worker_script: required (the script every process runs)")
        limit = _seconds(timeout_seconds, "timeout_seconds")
        spec = cluster_job_spec(
            n_workers,
            n_ps,
            worker_script=worker_script,
            cpu=cpu,
            memory=memory,
            gpus=gpus,
            mode=mode,
            replicas_to_aggregate=replicas_to_aggregate,
            max_staleness=max_staleness,
            args=args,
            env=env,
            name=name,
            chief=chief,
        )
        job = self._submit_spec(spec)
        ids = [str(WorkerRef(job.id, i)) for i in range(n_ps + n_workers + int(chief))]
        state = self.await_workers(ids, timeout_seconds=limit)
        roles = {w.worker_id: w.role for w in self.get(job.id).worker_list}
        role_of = {i: roles.get(int(i.rsplit("/", 1)[1])) for i in ids}
        servers = [i for i in ids if role_of[i] == PS_ROLE]
        chiefs = [i for i in ids if role_of[i] == CHIEF_ROLE]
        return {
            "job": job.id,
            "mode": mode,
            "ps": servers,
            "chief": chiefs,
            "workers": [i for i in ids if i not in servers and i not in chiefs],
            "addresses": {w["id"]: w["ip_address"] for w in state["workers"]},
            "failures": state["failures"],
        }
