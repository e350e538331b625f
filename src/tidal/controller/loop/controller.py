"""The controller loop: the only writer of desired state.

Each tick follows the hosts of a backend that reports them (see
:class:`~tidal.backends.base.HostDiscovery`), applies the requests users made through the
API (:mod:`~tidal.controller.store.requests`), observes what the backend reports
(:mod:`~tidal.controller.loop.observe`, failures in :mod:`~tidal.controller.loop.failures`), settles
scale-out deadlines (:mod:`~tidal.controller.loop.deadlines`), asks the policy for the next
allocation and checks it (:mod:`~tidal.controller.loop.allocation`), and tells the backend the
difference (:mod:`~tidal.controller.loop.apply`). This module only orchestrates: every change
is written to the store with an event and, when slots change, a point on the allocation
timeline. When ticks run is :mod:`~tidal.controller.loop.ticking`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

from tidal.backends.base import Backend, DrainNotices, HostDiscovery
from tidal.controller.cluster import ClusterModel, describe_change
from tidal.controller.loop.allocation import allocation_problems, plan_changes, policy_request
from tidal.controller.loop.apply import apply_slots
from tidal.controller.loop.cluster_scaling import ClusterRequests, node_labels
from tidal.controller.loop.deadlines import check_deadline
from tidal.controller.loop.draining import DrainBook
from tidal.controller.loop.effects import LoopEffects
from tidal.controller.loop.launching import JobFiles, build_launch
from tidal.controller.loop.observe import (
    apply_pending,
    cancel_unstarted,
    observe,
    throughput_models,
)
from tidal.controller.loop.team_reports import TeamReports
from tidal.controller.loop.ticking import TickThread
from tidal.controller.prometheus import ControllerMetrics
from tidal.controller.resource_groups import ClusterConfig, apply_groups
from tidal.controller.store.drains import DrainSource, HostDrain
from tidal.controller.store.jobs import Event, JobRecord, JobStore
from tidal.launch.api import JobLaunch, JobStatus
from tidal.model import Job
from tidal.model_states import ACTIVE_STATES, JobState
from tidal.policy.api import JobRequest, Policy, Slot
from tidal.policy.drain import evacuate
from tidal.policy.whole_replicas import WholeReplicas

__all__ = ["Controller"]

log = logging.getLogger(__name__)

#: Where a job may run and how many slots it needs: group, labels, minimum, widest replica.
_Target = tuple[str | None, tuple[tuple[str, str], ...], int, int]


class Controller:
    """Reconciles the store's jobs with the cluster through a policy and a backend."""

    def __init__(
        self,
        store: JobStore,
        cluster: ClusterModel,
        policy: Policy,
        backend: Backend,
        data_dir: Path,
        *,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        files: JobFiles | None = None,
        groups: ClusterConfig | None = None,
        scaling: ClusterRequests | None = None,
    ) -> None:
        """``groups``: the server config's resource groups, applied to every host the
        backend reports (:func:`~tidal.controller.resource_groups.apply_groups`).
        ``scaling``: tell a cluster that grows on request how many slots the jobs would
        use, each tick (``tidal server --autoscale``)."""
        self.store = store
        self.groups = groups
        self.scaling = scaling
        self.cluster = cluster
        self.policy = policy
        self.backend = backend
        self.files = files or JobFiles(data_dir)
        self.metrics = metrics or ControllerMetrics()
        self.effects = LoopEffects(store, backend, self.metrics)
        #: Why slots moved between teams, and each team's standing (team queues only).
        self.teams = TeamReports(store, self.metrics)
        #: Hosts being drained (stored; a restart keeps draining them).
        self.drains = DrainBook(store)
        self._clock = clock
        self._last_tick: float | None = None
        self._lock = threading.Lock()
        #: When ticks run: every interval, on request, quicker during a handover.
        self.ticker = TickThread(self.tick, store, self.metrics)
        store.on_request = self.wake
        self.metrics.slots_total.set(cluster.total_slots)

    # -- running ---------------------------------------------------------------------------

    def start(self, interval: float = 0.5) -> None:
        """Tick every ``interval`` seconds in a background thread until :meth:`stop`."""
        self.ticker.start(interval)

    def wake(self) -> None:
        """Tick now rather than at the end of the interval (a user asked for something)."""
        self.ticker.wake()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop ticking (the backend's jobs keep running until the backend is closed)."""
        self.ticker.stop(timeout)

    def tick(self) -> None:
        """One round: follow the hosts, apply requests, observe, allocate, apply."""
        with self._lock:
            now = self._clock()
            elapsed = 0.0 if self._last_tick is None else max(0.0, now - self._last_tick)
            self._last_tick = now
            self._discover()
            self._follow_notices(now)
            statuses = dict(self.backend.poll())
            active = self.store.list_jobs(states=ACTIVE_STATES)
            # Every pending request, not those of the active jobs by id: they are few
            # (applied ones are deleted), and a list of a thousand ids would be a
            # statement of a thousand parameters, made again each tick.
            pending = self.store.pending_requests()
            cancelled = cancel_unstarted(self.effects, active, pending, statuses, now)
            jobs = []
            for job in active:
                if job.id in cancelled:
                    continue
                job = apply_pending(self.effects, job, pending.get(job.id, ()), now)
                if not job.cancel_requested and not self.effects.loadable(job):
                    continue  # a cancel needs no model: such a job can still be cancelled
                observed = observe(
                    self.effects, self.cluster, job, statuses.get(job.id), now, elapsed
                )
                if observed is not None:
                    jobs.append(check_deadline(self.store, observed, now))
            self.effects.forget_models({j.id for j in jobs})
            requests = self._requests(jobs, now)
            held = self._schedule(jobs, statuses, now, requests)
            if self.scaling is not None:
                # Every job, placeable or not: a job too big for the cluster is what
                # growing it is for.
                asking = [j for j in jobs if not j.cancel_requested]
                labels = {
                    j.id: node_labels(self.effects.model(j).placement, self.groups) for j in asking
                }
                wanting = [requests[j.id] for j in asking]
                self.scaling.update(self.policy, wanting, self.cluster.to_policy(), held, labels)
            self._refresh_gauges(held)
            self.metrics.ticks.inc()

    # -- the cluster -----------------------------------------------------------------------

    def _discover(self) -> None:
        """Take the backend's hosts as the cluster, when it reports them."""
        if not isinstance(self.backend, HostDiscovery):
            return
        try:
            cluster = ClusterModel.from_hosts(self.backend.hosts())
            if self.groups is not None:
                cluster = ClusterModel(hosts=apply_groups(cluster.hosts, self.groups))
        except Exception:
            # Keep the last known hosts: a slow or failing lookup must not empty the cluster.
            log.exception("backend hosts() failed")
            return
        if cluster == self.cluster:
            return
        message = describe_change(self.cluster, cluster)
        log.info("cluster changed: %s", message)
        self.store.add_event(None, "cluster", message)
        self.cluster = cluster
        self.metrics.slots_total.set(cluster.total_slots)

    def _follow_notices(self, now: float) -> None:
        """Drain the hosts the backend's platform says are leaving (Ray's drain notice)."""
        if not isinstance(self.backend, DrainNotices):
            return
        try:
            leaving = self.backend.leaving()
        except Exception:
            log.exception("backend leaving() failed")
            return
        for host, leaves_at in leaving.items():
            if self.drains.covers(host, leaves_at) or self.cluster.host(host) is None:
                continue
            self.drains.mark(self.cluster, host, now, leaves_at=leaves_at, source=DrainSource.RAY)

    # -- allocating ------------------------------------------------------------------------

    def _requests(self, jobs: Sequence[JobRecord], now: float) -> dict[str, JobRequest]:
        """What the policy sees of each job."""
        models = throughput_models(self.effects, [j.id for j in jobs])
        return {j.id: policy_request(j, self.effects.model(j), now, models.get(j.id)) for j in jobs}

    def _schedule(
        self,
        jobs: Sequence[JobRecord],
        statuses: Mapping[str, JobStatus],
        now: float,
        asked: Mapping[str, JobRequest],
    ) -> dict[str, tuple[Slot, ...]]:
        """Allocate and apply; returns the slots each job holds afterwards."""
        held = {j.id: j.slots for j in jobs if j.slots}
        model = {j.id: self.effects.model(j) for j in jobs}
        # Jobs mostly target the same hosts: each target is looked up once a tick.
        shortfalls: dict[_Target, str | None] = {}
        placeable = [j for j in jobs if self._placeable(j, model[j.id], now, shortfalls)]
        requests = [asked[j.id] for j in placeable]
        # Slots of workers a user stopped are not the job's any more: the policy keeps
        # the rest, so exactly those workers leave.
        previous = {
            j.id: tuple(s for s in j.slots if s not in j.release_slots) for j in jobs if j.slots
        }
        occupied = {slot: job_id for job_id, st in statuses.items() for slot in st.alive_slots()}
        try:
            # Any policy, its answer made of whole replicas for workers of several slots,
            # asked without the slots of draining hosts.
            whole = WholeReplicas(self.policy)
            cluster = self.drains.policy_cluster(self.cluster)
            decision = evacuate(whole, requests, cluster, previous, now)
            proposed = decision.allocation
        except Exception as exc:
            log.exception("policy %s failed", getattr(self.policy, "name", "?"))
            self.effects.note_policy_error(f"{type(exc).__name__}: {exc}")
            return held
        problems = allocation_problems(
            proposed, {j.id: model[j.id] for j in placeable}, self.cluster
        )
        if problems:
            message = "; ".join(problems)
            log.error("policy %s returned an invalid allocation: %s", self.policy.name, message)
            self.effects.note_policy_error(f"invalid allocation: {message}")
            return held
        self.effects.clear()
        self.teams.record(self.policy)
        self.drains.record(decision, occupied, now)
        waiting = False
        least = {j.id: model[j.id].slot_range.min for j in placeable}
        for change in plan_changes(jobs, proposed, occupied, least):
            job = change.job
            if change.busy:
                # The slots' workers were released (this tick or an earlier one): look again
                # soon, so the grow follows their exit instead of the next interval.
                waiting = True
                self.effects.note_waiting(
                    job.id, f"waiting for {len(change.busy)} slot(s) to be released"
                )
                continue
            held[job.id] = apply_slots(
                self.effects,
                job,
                change.slots,
                partial(self._launch, job),
                now,
                known=job.id in statuses,
            )
        self.ticker.note_handover(waiting)
        return held

    def _placeable(
        self,
        job: JobRecord,
        model: Job,
        now: float,
        known: dict[_Target, str | None],
    ) -> bool:
        """Whether enough matching slots exist for ``job`` at all (else a queued job's
        reason says what is missing); ``known`` keeps the answers of this tick by target."""
        placement, least = model.placement, model.slot_range.min
        replica = max(r.resources.slots for r in model.roles)
        target = (placement.group, tuple(sorted(placement.labels.items())), least, replica)
        if target in known:
            shortfall = known[target]
        else:
            shortfall = known[target] = self.cluster.shortfall(
                placement.group, placement.labels, least, replica
            )
        if shortfall is None:
            return True
        if job.state is JobState.QUEUED:
            reason = f"queued: {shortfall}"
            if job.reason != reason:
                self.store.update_job(
                    job.id, now, reason=reason, event=Event("unplaceable", reason)
                )
        return False

    def _launch(self, job: JobRecord) -> JobLaunch:
        return build_launch(self.effects.model(job), self.files, gpu=self.cluster.gpu)

    # -- draining hosts --------------------------------------------------------------------

    def drain_host(self, host: str, *, leaves_at: float | None, source: DrainSource) -> HostDrain:
        """Mark ``host`` leaving (going at ``leaves_at`` if known) and tick at once: its
        jobs move off it at their next step boundary. ``UnknownHost`` if there is none."""
        drain = self.drains.mark(
            self.cluster, host, self._clock(), leaves_at=leaves_at, source=source
        )
        self.wake()
        return drain

    def undrain_host(self, host: str) -> bool:
        """Take ``host`` back into service; ``False`` when it was not draining."""
        back = self.drains.unmark(host, self._clock())
        self.wake()
        return back

    # -- what the API reads ----------------------------------------------------------------

    def log_paths(self, job_id: str) -> dict[int, Path]:
        """Each worker's log by worker id, also after the backend forgot the job."""
        return self.files.log_paths(job_id, self.backend)

    def _refresh_gauges(self, held: Mapping[str, tuple[Slot, ...]]) -> None:
        for state, n in self.store.count_by_state().items():
            self.metrics.jobs.labels(state=state.value).set(n)
        self.metrics.slots_used.set(sum(len(slots) for slots in held.values()))
