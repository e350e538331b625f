"""The SDK's worker verbs: launch workers, wait for them, stop them, start a PS cluster.

Mixed into :class:`tidal.client.Client`, whose transport (``_request``) they use; they
import nothing of it. Workers are the replicas of an ordinary job (they
hold slots of the pool and are listed by ``tidal list``), named ``"<job id>/<worker
index>"``; the pure parts (ids, specs, summaries) are :mod:`tidal.client.workers`.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tidal.client.errors import InvalidRequest, NotFound
from tidal.client.workers import (
    ENDED_STATES,
    WorkerArgumentError,
    WorkerRef,
    argument_problems,
    launch_spec,
    parse_worker_ids,
    summarise,
    unknown_worker,
)

if TYPE_CHECKING:
    import httpx

    from tidal.ps.config import Mode
    from tidal.wire.schema import JobDetail, JobView, Submitted

__all__ = ["WorkerVerbs"]

#: The first and the longest pause between two looks at the workers' jobs.
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0


def _seconds(value: Any, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkerArgumentError(f"{argument}: expected seconds >= 0, got {value!r}")
    if value < 0:
        raise WorkerArgumentError(f"{argument}: expected seconds >= 0, got {value}")
    return float(value)


class WorkerVerbs:
    """``launch_workers``, ``await_workers``, ``stop_workers`` and ``run_cluster``."""

    if TYPE_CHECKING:

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
        *,
        cpu: float = 1.0,
        memory: int | str | None = None,
        gpus: int = 0,
        script: str | None = None,
        command: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        role: str = "worker",
        name: str = "workers",
    ) -> builtins.list[str]:
        """Start ``n`` workers and return their ids (``"<job id>/<index>"``).

        They are one job of ``n`` fixed replicas, each holding one slot of the pool, each
        running ``command`` (a string is split like a shell would) or ``python script``
        (the server's interpreter) with ``env`` added to its environment; ``cpu`` and
        ``memory`` (bytes, or ``"4Gi"``) per worker. A worker that fails is not restarted:
        it is reported by :meth:`await_workers`, and its job fails (the others stop).
        A bad argument raises :class:`~tidal.client.workers.WorkerArgumentError` naming it, and
        nothing is submitted.
        """
        spec = launch_spec(
            n,
            cpu=cpu,
            memory=memory,
            gpus=gpus,
            script=script,
            command=command,
            env=env,
            role=role,
            name=name,
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
        ids: str | Iterable[str],
        wait_for_completion: bool = False,
        timeout_seconds: float = 60.0,
    ) -> dict[str, Any]:
        """Wait until every worker of ``ids`` runs (or, with ``wait_for_completion``, has
        exited), for at most ``timeout_seconds``.

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

    def stop_workers(self, ids: str | Iterable[str]) -> builtins.list[str]:
        """Stop the workers ``ids`` name; returns the ids of the jobs asked to stop some
        or all of their workers.

        A job whose every worker is named ends ``cancelled``. A job of which only some are
        named goes on without them: a fixed-size job (:meth:`launch_workers`) runs that
        many fewer from then on, an elastic one is scaled in by as many and gives up
        exactly their slots. The workers stop on the controller's next tick
        (:meth:`await_workers` with ``wait_for_completion`` waits for them; they end
        ``released``). Refused (:class:`~tidal.client.Conflict`, naming the id) for a
        worker that is not running, a replica of a multi-role job's fixed role (a
        parameter server, a chief) and an elastic job that would go below its minimum:
        nothing of that job is stopped (jobs named before it in ``ids`` may be).
        """
        from tidal.wire.schema import JobView

        refs = parse_worker_ids(ids)
        jobs = self._jobs_of(refs, "ids")
        whole: builtins.list[str] = []
        some: dict[str, builtins.list[int]] = {}
        for job_id, job in jobs.items():
            if job.state in ("succeeded", "failed", "cancelled"):
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
