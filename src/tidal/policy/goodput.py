"""``goodput``: slots where they buy the most training progress, fairly (after Pollux).

For each job a table of its best goodput for every worker count (each at its best batch
size, on as few nodes as possible) is built with :mod:`tidal.policy.goodput_model`. A job's
*speed-up* at ``w`` workers is that goodput over its goodput at an equal share of the
cluster. The policy maximises the p-norm (``p < 0``, Pollux uses ``-1``) of the speed-ups,
weighted by priority, which trades total progress against fairness: with ``p = -1`` it
minimises ``sum(priority_j / speedup_j)``.

Search is greedy instead of Pollux's genetic algorithm: every job first gets its minimum
(in priority, then submission order), then slots go, a batch at a time, to the job whose
utility rises most per slot; looking ahead over all larger sizes copes with tables that
are not concave (crossing a node boundary can cost more than a worker adds).

A job that holds slots pays for any change: its speed-up at every other size is scaled by
Pollux's re-allocation factor ``(age - reallocations * delay) / (age + delay)``, so young
jobs and jobs moved often are left where they are unless a move clearly pays.

Beyond Pollux (each a constructor switch, all on by default): a job's weight falls with
its attained service (a soft least-attained-service order, ``service_scale``); sizes are
1, 2, 4 slots or whole hosts (``whole_nodes``, after Sia), unless any size within one host
scores higher (``within_host``), and slots left idle go to whoever gains (``fill_idle``);
and a resized job stays packed on as few hosts as possible, in place where it can
(``packed``, :func:`~tidal.policy.packing.place_packed`), because the goodput tables
assume packed hosts and a scattered job runs far slower.

A job without a throughput model gets its minimum, unless ``prior_sync`` is set: then it
is modelled as scaling linearly but for a sync cost of that fraction of its one-worker
step time (what the live controller does for jobs that have not reported yet, so they
share like under ``fairshare`` until they do; see :func:`live_policy`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tidal.policy.api import Allocation, Cluster, JobRequest, Slot, ThroughputModel
from tidal.policy.autoscale import DEFAULT_SPEEDUP_THRESHOLD, efficient_slots, floor_slots
from tidal.policy.budget import CountingPolicy, Decision, SlotBudget, queue_order, slot_cap
from tidal.policy.goodput_model import FloatArray, best_goodput_table
from tidal.policy.packing import place_packed

#: Attained service (slot-seconds, about 55 GPU-hours) at which a job's weight is halved;
#: a smaller scale (10 GPU-hours) starved long jobs: higher mean, p99 and makespan.
DEFAULT_SERVICE_SCALE = 200000.0

#: Seconds over which a move must pay for itself: every move of a job that holds slots is
#: discounted by at least ``1 - reallocation_delay / MOVE_HORIZON``. Pollux's factor alone
#: is about 0.99 for a job hours old, so small moves (a host at a time) always passed.
MOVE_HORIZON = 200.0

#: Smallest re-allocation factor; see :meth:`GoodputPolicy._reallocation_factor`.
MIN_REALLOCATION_FACTOR = 0.05


@dataclass
class _JobState:
    """Greedy bookkeeping for one job.

    Utility tables hold the utility at 0..cap slots, -inf where the job may not run:
    ``shaped`` at the shaped sizes only, ``within_host`` also at any size that fits on one
    host, ``any_size`` at every size. ``utility`` is the table the greedy uses now.
    """

    job: JobRequest
    shaped: FloatArray
    within_host: FloatArray
    any_size: FloatArray
    cap: int
    utility: FloatArray = field(init=False)
    slots: int = 0

    def __post_init__(self) -> None:
        self.utility = self.shaped


class GoodputPolicy(CountingPolicy):
    """Pollux-style goodput maximisation with a fairness p-norm; see the module docstring."""

    name = "goodput"

    def __init__(
        self,
        p: float = -1.0,
        reallocation_delay: float = 30.0,
        prior_sync: float | None = None,
        packed: bool = True,
        whole_nodes: bool = True,
        service_scale: float | None = DEFAULT_SERVICE_SCALE,
        move_horizon: float | None = MOVE_HORIZON,
        within_host: bool = True,
        fill_idle: bool = True,
        speedup_threshold: float = DEFAULT_SPEEDUP_THRESHOLD,
    ) -> None:
        """``p``: fairness exponent (< 0); ``reallocation_delay``: seconds one move costs a
        job; ``prior_sync``: model jobs without a throughput model (see the module);
        ``packed``: place resized jobs afresh on as few hosts as possible; ``whole_nodes``:
        only sizes of 1, 2, 4 slots or whole hosts; ``service_scale``: slot-seconds of
        attained service that halve a job's weight (``None``: no discount); ``move_horizon``:
        seconds over which a move must repay its delay (``None``: Pollux's factor alone);
        ``within_host``: with ``whole_nodes``, also try any size that fits on one host and
        keep whichever scores higher; ``fill_idle``: slots the sizes leave idle go to jobs
        that gain from them, at any size; ``speedup_threshold``: with ``--autoscale``, a job
        wants the most slots at which its goodput per slot is at least this fraction of
        its goodput per slot at its minimum (see :mod:`tidal.policy.autoscale`)."""
        if move_horizon is not None and move_horizon <= 0:
            raise ValueError("move_horizon must be > 0 (seconds) or None")
        if service_scale is not None and service_scale <= 0:
            raise ValueError("service_scale must be > 0 (slot-seconds) or None")
        if p >= 0:
            raise ValueError("p must be negative")
        if prior_sync is not None and prior_sync < 0:
            raise ValueError("prior_sync must be >= 0")
        if not 0 < speedup_threshold <= 1:
            raise ValueError("speedup_threshold must be in (0, 1]")
        self.speedup_threshold = speedup_threshold
        self.p = p
        self.reallocation_delay = reallocation_delay
        self.prior_sync = prior_sync
        self.packed = packed
        self.whole_nodes = whole_nodes
        self.service_scale = service_scale
        self.move_horizon = move_horizon
        self.within_host = within_host
        self.fill_idle = fill_idle
        self._prior = (
            None
            if prior_sync is None
            else ThroughputModel(
                alpha_compute=0.0,
                beta_compute=1.0,
                alpha_sync_local=prior_sync,
                beta_sync_local=0.0,
                alpha_sync_node=prior_sync,
                beta_sync_node=0.0,
                init_batch_size=1,
                max_local_batch=1,
                max_global_batch=1,
            )
        )

    def counts(self, decision: Decision) -> dict[str, int]:
        """Greedy marginal-utility sizes."""
        jobs, cluster, budget, held = (
            decision.jobs,
            decision.cluster,
            decision.budget,
            decision.held,
        )
        if not jobs or cluster.total_slots == 0:
            return {}
        slots_per_node = max(h.slots for h in cluster.hosts)
        fair = max(1, cluster.total_slots // len(jobs))
        # Positions follow the queue order, so ties break the same way for any input order.
        states = [
            self._state(
                job, min(slot_cap(job), budget.size_of(job.group)), held, fair, slots_per_node
            )
            for job in sorted(jobs, key=queue_order)
        ]

        # Minimums first: the p-norm is -inf while any job sits at zero, so everyone who
        # can be started is; the order only matters when there are more jobs than slots.
        for state in states:
            size = max(1, state.job.min_slots)
            if size <= state.cap and size <= budget.room(state.job.group):
                state.slots = size
                budget.take(state.job.group, size)

        if self.whole_nodes and self.within_host:
            start = {s.job.job_id: s.slots for s in states}
            shaped = self._trial(states, budget, start, within_host=False)
            within_host = self._trial(states, budget, start, within_host=True)
            # Shapes keep hosts packable, but can hand a slot to one job for a tiny gain
            # where another could use it far better (a 4-slot host shared 2 + 2 instead of
            # 3 + 1): the sizes within one host are taken when they score higher.
            # On a tie the shapes win (max keeps the first of equals).
            best = max((shaped, within_host), key=lambda counts: self._objective(counts, states))
            for state in states:
                budget.take(state.job.group, best[state.job.job_id] - state.slots)
                state.slots = best[state.job.job_id]
        else:
            self._grow(states, budget)
        if self.fill_idle and budget.room(None) > 0:
            # A slot left idle buys nothing: what the sizes left over goes to whoever gains.
            for state in states:
                state.utility = state.any_size
            self._grow(states, budget)

        return {s.job.job_id: s.slots for s in states if s.slots > 0}

    def slots_wanted(
        self, jobs: Sequence[JobRequest], cluster: Cluster, previous: Allocation
    ) -> dict[str, int]:
        """Each job's slots up to where its predicted speed-up stops paying for them
        (``speedup_threshold``); a job without a throughput model wants its minimum."""
        slots_per_node = max((h.slots for h in cluster.hosts), default=1)
        wants: dict[str, int] = {}
        for job in jobs:
            cap, floor = slot_cap(job), floor_slots(job)
            model = job.throughput or self._prior
            if cap <= 0:
                continue
            if model is None:
                wants[job.job_id] = floor
                continue
            table = _goodput_by_slots(job, model, cap, slots_per_node)
            wants[job.job_id] = efficient_slots(
                [float(g) for g in table], floor, self.speedup_threshold
            )
        return wants

    def place(self, counts: Mapping[str, int], decision: Decision) -> dict[str, tuple[Slot, ...]]:
        """Packed on as few hosts as possible (``packed``), else moving as little as can be."""
        if self.packed:
            return place_packed(counts, decision.by_id, decision.cluster, decision.previous)
        return super().place(counts, decision)

    def _trial(
        self,
        states: list[_JobState],
        budget: SlotBudget,
        start: dict[str, int],
        *,
        within_host: bool,
    ) -> dict[str, int]:
        """The sizes the greedy reaches from ``start``; states and budget are restored."""
        saved = dict(budget.free)
        for state in states:
            state.utility = state.within_host if within_host else state.shaped
        self._grow(states, budget)
        counts = {s.job.job_id: s.slots for s in states}
        for state in states:
            state.slots = start[state.job.job_id]
            state.utility = state.shaped
        budget.free = saved
        return counts

    @staticmethod
    def _objective(counts: dict[str, int], states: list[_JobState]) -> float:
        """The policy's objective for ``counts`` (higher is better), at any size."""
        return sum(
            float(s.any_size[counts[s.job.job_id]])
            for s in states
            if counts.get(s.job.job_id, 0) > 0
        )

    def _grow(self, states: list[_JobState], budget: SlotBudget) -> None:
        """Hand out the budget's room a step at a time to the best gain per slot."""
        heap: list[tuple[float, int, int]] = []
        for position, state in enumerate(states):
            self._push(heap, position, state, budget)
        while heap and budget.room(None) > 0:
            _, position, step = heapq.heappop(heap)
            state = states[position]
            if step > budget.room(state.job.group):
                # Stale: other jobs took the slots this step needed; re-price and retry.
                self._push(heap, position, state, budget)
                continue
            state.slots += step
            budget.take(state.job.group, step)
            self._push(heap, position, state, budget)

    def _state(
        self, job: JobRequest, cap: int, held: dict[str, int], fair: int, slots_per_node: int
    ) -> _JobState:
        """Utility table of ``job`` at every size it may get."""
        model = job.throughput or self._prior
        if model is None or cap <= 0:
            # Nothing known about scaling: more than the minimum buys nothing.
            speed = np.zeros(cap + 1)
            speed[min(max(1, job.min_slots), cap) :] = 1.0 if cap > 0 else 0.0
        else:
            goodput = _goodput_by_slots(job, model, cap, slots_per_node)
            reference = goodput[min(fair, cap)]
            speed = goodput / reference if reference > 0 else goodput
        current = held.get(job.job_id, 0)
        if current > 0:
            factor = self._reallocation_factor(job)
            keep = speed[current] if current <= cap else None
            speed = speed * factor
            if keep is not None:
                speed[current] = keep
        with np.errstate(divide="ignore"):
            utility = np.where(speed > 0, -(speed**self.p), -np.inf) * max(job.priority, 1)
        if self.service_scale is not None:
            # Least attained service first, softly: short jobs finish sooner, which is what
            # lowers the average completion time when the cluster is contended.
            utility = utility / (1.0 + job.attained_service / self.service_scale)
        utility[: max(1, job.min_slots)] = -np.inf
        utility[0] = -math.inf
        any_size = utility.copy()
        within_host = utility  # the same table when no sizes are ruled out
        if self.whole_nodes:
            sizes = np.arange(len(utility))
            allowed = (sizes % slots_per_node == 0) | (sizes <= slots_per_node) & (
                (sizes & (sizes - 1)) == 0
            )
            allowed[min(current, cap)] = True
            allowed[min(max(1, job.min_slots), cap)] = True
            within_host = np.where(allowed | (sizes <= slots_per_node), utility, -np.inf)
            utility = np.where(allowed, utility, -np.inf)
        return _JobState(
            job=job, shaped=utility, within_host=within_host, any_size=any_size, cap=cap
        )

    def _reallocation_factor(self, job: JobRequest) -> float:
        """Pollux's discount on moving a running job.

        Floored at :data:`MIN_REALLOCATION_FACTOR` rather than zero: a job moved very often
        (or whose ``age`` the caller left at 0) becomes very hard to move, but can still be
        shrunk when that is the only way to start others.
        """
        delay = self.reallocation_delay
        if delay <= 0:
            return 1.0
        factor = (job.age - job.reallocations * delay) / (job.age + delay)
        if self.move_horizon is not None:
            factor = min(factor, 1.0 - delay / self.move_horizon)
        return max(MIN_REALLOCATION_FACTOR, factor)

    def _push(
        self,
        heap: list[tuple[float, int, int]],
        position: int,
        state: _JobState,
        budget: SlotBudget,
    ) -> None:
        """Queue ``state``'s best step (slots to add, gain per slot), if it gains anything."""
        if state.slots == 0:
            return
        room = min(budget.room(state.job.group), state.cap - state.slots)
        if room <= 0:
            return
        now = state.utility[state.slots]
        ahead = state.utility[state.slots + 1 : state.slots + room + 1]
        per_slot = (ahead - now) / np.arange(1, room + 1)
        best = int(np.argmax(per_slot))
        gain = float(per_slot[best])
        if gain > 0 and math.isfinite(gain):
            heapq.heappush(heap, (-gain, position, best + 1))


#: Sync cost assumed for a job that has not reported yet, as a fraction of its step time.
LIVE_PRIOR_SYNC = 0.05


def _goodput_by_slots(
    job: JobRequest, model: ThroughputModel, cap: int, slots_per_node: int
) -> FloatArray:
    """The job's best goodput at ``0..cap`` slots. The model is fitted per worker process:
    a job whose workers hold several slots each (several GPUs) runs ``slots // width``
    of them, so a slot that completes no worker buys nothing."""
    width = job.replica_slots if not job.gang_slots else 1
    if width <= 1:
        return best_goodput_table(model, cap, slots_per_node)[0]
    per_worker, _ = best_goodput_table(model, cap // width, max(1, slots_per_node // width))
    return per_worker[np.arange(cap + 1) // width]


def live_policy(
    p: float = -1.0,
    reallocation_delay: float = 30.0,
    prior_sync: float | None = LIVE_PRIOR_SYNC,
    speedup_threshold: float = DEFAULT_SPEEDUP_THRESHOLD,
) -> GoodputPolicy:
    """``goodput`` as ``tidal server --policy goodput`` runs it: jobs that have not
    reported a throughput model yet are assumed to scale nearly linearly (``prior_sync``),
    so they share the cluster like under ``fairshare`` until their reports say otherwise."""
    return GoodputPolicy(
        p=p,
        reallocation_delay=reallocation_delay,
        prior_sync=prior_sync,
        speedup_threshold=speedup_threshold,
    )


def plain_policy(reallocation_delay: float = 30.0) -> GoodputPolicy:
    """``goodput-plain``: Pollux's rules alone (no repacking, any size, no attained-service
    weighting, no move horizon), to measure what tidal's additions buy in simulation."""
    return GoodputPolicy(
        reallocation_delay=reallocation_delay,
        packed=False,
        whole_nodes=False,
        service_scale=None,
        move_horizon=None,
    )
