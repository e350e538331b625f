"""The cluster the controller hands out: hosts with slots, resource groups and labels."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tidal.backends.base import DiscoveredHost
from tidal.policy.api import Cluster, Host, Slot

__all__ = ["ClusterHost", "ClusterModel", "describe_change", "detect_local", "local_address"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterHost:
    """One machine: ``slots`` GPUs (or virtual CPU slots when ``gpu`` is false)."""

    name: str
    slots: int
    gpu: bool = False
    group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The IP address workers on this host are reached at (``None``: not known).
    address: str | None = None
    #: CPUs and bytes of memory the host offers its workers (``None``: not known).
    cpus: float | None = None
    memory: int | None = None

    def matches(self, group: str | None, labels: Mapping[str, str]) -> bool:
        """Whether a job targeting ``group`` with node ``labels`` may run here."""
        if group is not None and group != self.group:
            return False
        return all(self.labels.get(k) == v for k, v in labels.items())


@dataclass(frozen=True)
class ClusterModel:
    """The hosts the controller manages, in a stable order."""

    hosts: tuple[ClusterHost, ...]

    def __post_init__(self) -> None:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique (got {names})")
        if any(h.slots < 0 for h in self.hosts):
            raise ValueError("a host cannot have a negative number of slots")

    @property
    def total_slots(self) -> int:
        """Number of slots over all hosts."""
        return sum(h.slots for h in self.hosts)

    @property
    def gpu(self) -> bool:
        """Whether the slots are accelerators (every host has GPUs)."""
        return bool(self.hosts) and all(h.gpu for h in self.hosts)

    def host(self, name: str) -> ClusterHost | None:
        """The host called ``name``, if any."""
        return next((h for h in self.hosts if h.name == name), None)

    def has_slot(self, slot: Slot) -> bool:
        """Whether ``slot`` exists in this cluster."""
        host = self.host(slot[0])
        return host is not None and 0 <= slot[1] < host.slots

    def can_place(
        self, group: str | None, labels: Mapping[str, str], workers: int, replica: int = 1
    ) -> bool:
        """Whether enough matching slots exist at all for ``workers`` workers (slots), and
        a matching host wide enough for one replica of ``replica`` slots."""
        hosts = [h for h in self.hosts if h.matches(group, labels)]
        return sum(h.slots for h in hosts) >= workers and any(h.slots >= replica for h in hosts)

    def largest(self, group: str | None, labels: Mapping[str, str]) -> ClusterHost | None:
        """The hosts matching ``group`` and ``labels`` (any host when none does) as one
        host of the most CPUs and the most memory any of them reports (``None`` for
        either: no host reports it), for the check that one worker fits somewhere."""
        hosts = [h for h in self.hosts if h.matches(group, labels)] or list(self.hosts)
        if not hosts:
            return None
        cpus = [h.cpus for h in hosts if h.cpus is not None]
        memory = [h.memory for h in hosts if h.memory is not None]
        return ClusterHost(
            "largest", 0, cpus=max(cpus, default=None), memory=max(memory, default=None)
        )

    def widest(self, group: str | None, labels: Mapping[str, str]) -> int | None:
        """Most slots one host matching ``group`` and ``labels`` has (``None``: no host
        matches): the largest replica such a job can run."""
        return max((h.slots for h in self.hosts if h.matches(group, labels)), default=None)

    def shortfall(
        self, group: str | None, labels: Mapping[str, str], workers: int, replica: int = 1
    ) -> str | None:
        """Why ``workers`` workers (slots) targeting ``group`` and ``labels``, whose widest
        replica holds ``replica`` slots on one host, can never be placed on this cluster
        (``None`` when they can): the first missing thing, named as the user wrote it
        (``no host has label nvidia=t4``)."""
        if self.can_place(group, labels, workers, replica):
            return None
        hosts = [h for h in self.hosts if group is None or h.group == group]
        if not hosts:
            return f"no host is in group {group}"
        for key, value in sorted(labels.items()):
            hosts = [h for h in hosts if h.labels.get(key) == value]
            if not hosts:
                return f"no host has label {key}={value}"
        widest = max(h.slots for h in hosts)
        if widest < replica:
            return (
                f"one replica needs {replica} slots on one host; the widest host that "
                f"matches has {widest}"
            )
        matching = sum(h.slots for h in hosts)
        return f"needs {workers} slot(s); the hosts that match have {matching}"

    def to_policy(self, leaving: Mapping[str, float | None] | None = None) -> Cluster:
        """The plain view a policy sees; the hosts in ``leaving`` are marked leaving, each
        at its time (``None``: not known)."""
        leaving = leaving or {}
        return Cluster(
            hosts=tuple(
                Host(
                    name=h.name,
                    slots=h.slots,
                    group=h.group,
                    labels=dict(h.labels),
                    leaving=h.name in leaving,
                    leaves_at=leaving.get(h.name),
                )
                for h in self.hosts
            )
        )

    @classmethod
    def from_hosts(cls, hosts: Sequence[DiscoveredHost]) -> ClusterModel:
        """The hosts a backend discovered (see :class:`~tidal.backends.base.HostDiscovery`)."""
        return cls(
            hosts=tuple(
                ClusterHost(
                    h.name,
                    h.slots,
                    gpu=h.gpu,
                    group=h.group,
                    labels=dict(h.labels),
                    address=h.address,
                    cpus=h.cpus,
                    memory=h.memory,
                )
                for h in hosts
            )
        )

    @classmethod
    def single(
        cls,
        slots: int,
        *,
        gpu: bool = False,
        name: str | None = None,
        address: str | None = None,
    ) -> ClusterModel:
        """One host (this machine by default) with ``slots`` slots."""
        host = ClusterHost(name=name or socket.gethostname(), slots=slots, gpu=gpu, address=address)
        return cls(hosts=(host,))


def describe_change(old: ClusterModel, new: ClusterModel) -> str:
    """The hosts that joined, left or changed size, for the ``cluster`` event."""
    before = {h.name: h.slots for h in old.hosts}
    after = {h.name: h.slots for h in new.hosts}
    changes = [f"+{n} ({k} slots)" for n, k in after.items() if n not in before]
    changes += [f"-{n}" for n in before if n not in after]
    changes += [f"{n}: {before[n]} → {k} slots" for n, k in after.items() if before.get(n, k) != k]
    return f"{len(after)} host(s), {new.total_slots} slots: " + ", ".join(changes)


def _gpu_count() -> int:
    try:
        import torch  # imported here: torch costs seconds and only detection needs it
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


#: Listen addresses that mean "every interface" rather than one address.
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def local_address(listen: str = "127.0.0.1") -> str:
    """The IP address this machine's workers are reached at, for a server listening on
    ``listen``: that address itself, or for a wildcard the address this host's name
    resolves to (``127.0.0.1`` when it resolves to none)."""
    if listen not in _WILDCARDS:
        return listen.strip("[]")
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def detect_local(
    slots: int | None = None,
    *,
    group: str | None = None,
    labels: Mapping[str, str] | None = None,
    name: str | None = None,
    gpu_count: int | None = None,
    address: str | None = None,
) -> ClusterModel:
    """This machine as a one-host cluster, reached at ``address``.

    ``slots`` given: that many virtual CPU slots (also on a GPU machine, for testing).
    Otherwise one slot per visible GPU, or one CPU slot per core when there is no GPU.
    """
    if slots is not None:
        if slots < 1:
            raise ValueError(f"slots must be ≥ 1 (got {slots})")
        count, gpu = slots, False
    else:
        gpus = _gpu_count() if gpu_count is None else gpu_count
        count, gpu = (gpus, True) if gpus > 0 else (os.cpu_count() or 1, False)
    log.info("cluster: %d %s slot(s) on this host", count, "GPU" if gpu else "CPU")
    host = ClusterHost(
        name=name or socket.gethostname(),
        slots=count,
        gpu=gpu,
        group=group,
        labels=labels or {},
        address=address,
        cpus=float(len(os.sched_getaffinity(0))),
        memory=physical_memory(),
    )
    return ClusterModel(hosts=(host,))


def physical_memory() -> int | None:
    """This machine's memory in bytes (``None`` where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
