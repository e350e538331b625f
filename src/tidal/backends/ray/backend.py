"""The Ray backend: every job's workers run as actors on the nodes of a Ray cluster.

Each job has a :class:`~tidal.launch.groups.elastic.WorkerGroup` in the controller process, driven
by a thread of its own through the same :class:`~tidal.launch.driver.GroupDriver` as the
local backend's agents: it hosts the job's rendezvous store (on an address the nodes can
reach), publishes generations and handles resizes and failures exactly as they do. Only
the processes differ: a worker is a :class:`~tidal.backends.ray.actor.WorkerActor` pinned
to the node of its slot, running the user's command there (see :mod:`.worker`). A job of
several roles (or of a ``tf``, ``mpi`` or ``ps`` launcher) runs as
:class:`~tidal.launch.groups.roles.RoleGroups` the same way, its replicas reached at their
nodes' addresses (see :mod:`.network`).

Hosts are the cluster's alive nodes that offer slots: one slot per unit of the custom
resource ``tidal_slot`` (nodes started with ``--resources '{"tidal_slot": 4}'``), or per
GPU on nodes without it. The controller polls :meth:`RayBackend.hosts`, so nodes that join
add slots and nodes that die take theirs away; their workers' actors die with them, which
the group handles like any worker killed mid-step.

Unlike the local backend, jobs do not outlive the controller: the actors belong to the
controller's Ray driver and end with it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from ray.autoscaler.sdk import request_resources

from tidal.backends.base import LOCAL, DiscoveredHost
from tidal.backends.ray.drain_notices import DrainWatch
from tidal.backends.ray.network import RayNetwork
from tidal.backends.ray.worker import RaySpawner
from tidal.launch.api import JobLaunch, JobStatus, read_reports, worker_logs
from tidal.launch.driver import GroupDriver
from tidal.launch.slot_names import format_slot
from tidal.launch.worker import worker_spec
from tidal.policy.api import Slot
from tidal.policy.autoscale import SlotBundle

__all__ = ["SLOT_RESOURCE", "RayBackend"]

log = logging.getLogger("tidal.backends.ray")

#: The custom resource that makes slots of a CPU-only node: ``{"tidal_slot": 4}``.
SLOT_RESOURCE = "tidal_slot"
#: How long a released job's workers get to leave (rank 0 checkpoints first).
_STOP_GRACE = 30.0


@dataclass(frozen=True)
class _Node:
    node_id: str
    #: What one worker takes on the node: ``tidal_slot`` or ``GPU``.
    resource: str
    #: The node's IP address, where its workers are reached.
    address: str


@dataclass
class _Job:
    """One job's driver, the thread that runs it, and what passes between that thread and
    the controller's (the job's :class:`~tidal.launch.driver.JobControl`)."""

    launch: JobLaunch
    driver: GroupDriver
    status: JobStatus
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Slots asked for by the controller, not yet handed to the group.
    requested: list[str] | None = None
    stopping: bool = False
    #: The workers' report batches (metrics, goodput) not yet handed to the controller.
    reports: list[dict[str, Any]] = field(default_factory=list)
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def requests(self) -> tuple[Sequence[str] | None, bool]:
        """The slots asked for since the last call, and whether the job is to stop."""
        with self.lock:
            requested, self.requested = self.requested, None
            return requested, self.stopping

    def publish(self, status: JobStatus, ended: bool, reports: list[dict[str, Any]]) -> None:
        """Keep the status and the batches until the controller's next poll."""
        with self.lock:
            self.status = status
            self.reports.extend(reports)


class RayBackend:
    """Runs every job's workers as actors on a Ray cluster; see the module docstring."""

    #: What the local backend runs: several roles, every launcher and restart policy
    #: (a ``tf`` replica is reached at its node's address, see :mod:`.network`).
    capabilities = replace(LOCAL, name="the Ray backend")

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        ray_address: str | None = None,
        slot_resource: str = SLOT_RESOURCE,
        store_host: str | None = None,
        timeout: float = 10.0,
        refresh: float = 1.0,
    ) -> None:
        """Join the Ray cluster at ``ray_address`` (``auto``: the one running on this
        machine; ``None``: ``RAY_ADDRESS``, else a new single-node one), unless this
        process already joined one.

        ``store_host`` is the address the nodes reach this machine at, for the jobs'
        rendezvous stores (default: this node's address as Ray knows it). ``timeout``
        bounds collectives and joins inside the workers. Hosts are looked up again at
        most every ``refresh`` seconds."""
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            # Workers' output reaches the job's log files through the actors, not the
            # server's terminal.
            ray.init(address=ray_address, log_to_driver=False, logging_level=logging.WARNING)
        self.slot_resource = slot_resource
        self.store_host = store_host or ray.util.get_node_ip_address()
        self.timeout = timeout
        self.refresh_every = refresh
        self._jobs: dict[str, _Job] = {}
        self._log_dirs: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._hosts: list[DiscoveredHost] = []
        self._refreshed = 0.0
        self._drain_watch = DrainWatch()
        self.refresh()
        log.info(
            "ray backend: %d host(s), %d slot(s); stores on %s",
            len(self._hosts),
            sum(h.slots for h in self._hosts),
            self.store_host,
        )

    # -- hosts ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Look up the cluster's alive nodes and the slots they offer."""
        hosts: list[DiscoveredHost] = []
        nodes: dict[str, _Node] = {}
        alive = [n for n in ray.nodes() if n.get("Alive")]
        for node in sorted(alive, key=lambda n: (str(n["NodeManagerAddress"]), n["NodeID"])):
            resources: Mapping[str, float] = node.get("Resources", {})
            resource, gpu = self.slot_resource, False
            count = int(resources.get(self.slot_resource, 0))
            if count <= 0:
                resource, gpu = "GPU", True
                count = int(resources.get("GPU", 0))
            if count <= 0:
                continue  # a head or service node that offers no slot
            name = f"{node['NodeManagerAddress']}-{str(node['NodeID'])[:8]}"
            labels = {
                str(k): str(v)
                for k, v in (node.get("Labels") or {}).items()
                if not str(k).startswith("ray.io/")
            }
            address = str(node["NodeManagerAddress"])
            cpus = resources.get("CPU")
            memory = resources.get("memory")
            hosts.append(
                DiscoveredHost(
                    name,
                    count,
                    gpu=gpu,
                    labels=labels,
                    address=address,
                    cpus=float(cpus) if cpus is not None else None,
                    memory=int(memory) if memory is not None else None,
                )
            )
            nodes[name] = _Node(str(node["NodeID"]), resource, address)
        with self._lock:
            self._hosts, self._nodes = hosts, nodes
            self._refreshed = time.monotonic()

    def hosts(self) -> Sequence[DiscoveredHost]:
        """The alive nodes with slots (looked up at most every ``refresh`` seconds)."""
        if time.monotonic() - self._refreshed >= self.refresh_every:
            self.refresh()
        with self._lock:
            return list(self._hosts)

    def leaving(self) -> dict[str, float | None]:
        """The hosts whose nodes Ray is draining, with their deadlines
        (:class:`~tidal.backends.base.DrainNotices`; :mod:`.drain_notices`)."""
        with self._lock:
            node_ids = {host: node.node_id for host, node in self._nodes.items()}
        return self._drain_watch.leaving(node_ids)

    def request_slots(self, slots: int) -> None:
        """Ask Ray's autoscaler for room for ``slots`` slots in all: one bundle of one
        ``slot_resource`` each, replacing the previous request (Ray's
        ``request_resources``; 0 withdraws it, and idle nodes leave after Ray's idle
        timeout)."""
        self.request_bundles([SlotBundle() for _ in range(slots)])

    def request_bundles(self, bundles: Sequence[SlotBundle]) -> None:
        """Ask Ray's autoscaler for room for each bundle: ``{slot_resource: width}``,
        with the bundle's labels as its label selector (honoured by Ray's autoscaler v2;
        v1 drops selectors), replacing the previous request (Ray's ``request_resources``;
        none withdraws it)."""
        shapes: list[dict[str, float]] = [{self.slot_resource: b.slots} for b in bundles]
        selectors = [dict(b.labels) for b in bundles]
        if not any(selectors):
            request_resources(bundles=shapes)
        else:
            try:
                request_resources(bundles=shapes, bundle_label_selectors=selectors)
            except ValueError as exc:
                # Labels Ray cannot read as a selector match no Ray node either: ask for
                # the room without them rather than not at all.
                log.warning("label selectors refused by Ray (%s); asking without them", exc)
                request_resources(bundles=shapes)
        log.info(
            "asked Ray's autoscaler for %d bundle(s), %d %s in all",
            len(bundles),
            sum(b.slots for b in bundles),
            self.slot_resource,
        )

    def _node(self, host: str) -> _Node | None:
        with self._lock:
            return self._nodes.get(host)

    # -- jobs ----------------------------------------------------------------------------

    @property
    def job_ids(self) -> list[str]:
        """Jobs this backend currently runs."""
        return sorted(self._jobs)

    def start(self, launch: JobLaunch, slots: Sequence[Slot]) -> None:
        """Start the job's group, which starts one worker actor per worker's slots."""
        existing = self._jobs.get(launch.job_id)
        if existing is not None and not existing.stopping:
            self.assign(launch.job_id, slots)
            return
        driver = GroupDriver(
            launch.job_id,
            # Ray gives each GPU worker its GPU (CUDA_VISIBLE_DEVICES) itself.
            worker_spec(launch, timeout=self.timeout, pin_gpus=False),
            spawner=RaySpawner(self._placement, on_lost=self.refresh),
            store_host=self.store_host,
            stop_grace=_STOP_GRACE,
            roles=launch.roles,
            # Hostfiles and parameter servers' address files: the job's folder, which
            # replicas on other nodes see only on a shared filesystem (docs/ray.md).
            work_dir=launch.log_dir.parent if launch.log_dir is not None else None,
            network=RayNetwork(self._node_address),
        )
        # Its slots are held from now on, before its thread reports the first workers.
        job = _Job(launch, driver, JobStatus(launch.job_id, -1, starting_slots=tuple(slots)))
        job.requested = self._reachable(slots)
        job.thread = threading.Thread(
            target=self._drive, args=(job,), name=f"tidal-ray-{launch.job_id}", daemon=True
        )
        self._jobs[launch.job_id] = job
        if launch.log_dir is not None:
            self._log_dirs[launch.job_id] = launch.log_dir
        job.thread.start()
        log.info(
            "job=%s started on %d slot(s), store %s",
            launch.job_id,
            len(slots),
            driver.group.host.address,
        )

    def _placement(self, host: str) -> tuple[str, str] | None:
        node = self._node(host)
        return None if node is None else (node.node_id, node.resource)

    def _node_address(self, host: str) -> tuple[str, str] | None:
        node = self._node(host)
        return None if node is None else (node.node_id, node.address)

    def _reachable(self, slots: Sequence[Slot]) -> list[str]:
        """The slots whose node is alive: a worker placed on a dead node would only fail,
        and count against the job's restart budget."""
        self.refresh()  # one lookup per change of a job's slots: rare, and worth it
        kept = [s for s in slots if self._node(s[0]) is not None]
        if len(kept) < len(slots):
            log.info("skipping %d slot(s) on nodes that are gone", len(slots) - len(kept))
        return [format_slot(s) for s in kept]

    def assign(self, job_id: str, slots: Sequence[Slot]) -> None:
        """Set the job's slots (applied at its next step boundary)."""
        job = self._jobs[job_id]
        names = self._reachable(slots)
        with job.lock:
            job.requested = names

    def stop(self, job_id: str) -> None:
        """Release the job's workers (rank 0 checkpoints), then end its group."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        with job.lock:
            job.stopping = True

    @staticmethod
    def _drive(job: _Job) -> None:
        """The job's thread: what the local backend's agent process does, in a thread."""
        try:
            job.driver.drive(job)
        finally:
            job.done.set()

    def poll(self) -> Mapping[str, JobStatus]:
        """Every job's workers as its thread last saw them; a job whose group ended is
        reported once more, then forgotten."""
        statuses: dict[str, JobStatus] = {}
        for job_id, job in list(self._jobs.items()):
            # done is read before the reports: a job's last reports arrive before it is set.
            done = job.done.is_set()
            with job.lock:
                batches, job.reports = job.reports, []
                status = job.status
            metrics, goodput = read_reports(batches)
            statuses[job_id] = replace(status, metrics=metrics, goodput=goodput)
            if done:
                del self._jobs[job_id]
        return statuses

    def log_paths(self, job_id: str) -> Mapping[int, Path]:
        """Each worker's log file by worker id (in the controller's log dir: the output
        is pulled from the nodes through the actors)."""
        return worker_logs(self._log_dirs.get(job_id))

    def close(self, grace: float = _STOP_GRACE) -> None:
        """Stop every job (workers checkpoint and leave), wait for their groups to end,
        and leave the Ray cluster if this backend joined it."""
        jobs = list(self._jobs.values())
        for job in jobs:
            with job.lock:
                job.stopping = True
        deadline = time.monotonic() + grace + 15
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=max(0.0, deadline - time.monotonic()))
                if job.thread.is_alive():
                    log.warning("job=%s did not stop in time", job.launch.job_id)
        self._jobs.clear()
        if self._owns_ray and ray.is_initialized():
            # Ends every actor this driver owns, whatever state its job was left in.
            ray.shutdown()
