"""A multi-role job's processes: one group per role (in the local backend's agent, or a
thread of the Ray backend).

The controller gives the job one set of slots; :func:`~tidal.launch.groups.role_slots.
assign_roles` splits it among the roles (fixed roles keep their slots, the elastic role
takes the rest). A role whose launcher is ``tidal`` or ``torchrun`` runs as today's group
(:func:`~tidal.launch.launchers.make_group`); a ``tf``, ``mpi`` or ``ps`` role runs as a
:class:`~tidal.launch.groups.replicas.ReplicaSet` of plain processes started with the variables
of :mod:`tidal.launch.groups.role_env`. Worker numbers come from one counter, so they are unique
across roles.

The job succeeds once every role that ends it succeeded (:func:`~tidal.policy.
role_restart.job_outcome`); the other roles (parameter servers) are then stopped.

A ``tf`` replica's address is its slot's host and a port free there, fixed at the first
assignment; where a slot is reached is the backend's :class:`~tidal.launch.endpoints.
SlotNetwork` (this machine by default; the node's address on Ray).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tidal.launch.api import RoleLaunch
from tidal.launch.endpoints import LoopbackNetwork, SlotNetwork
from tidal.launch.groups.api import Group, GroupEvent, JobGroup, Outcome
from tidal.launch.groups.replicas import ReplicaSet
from tidal.launch.groups.role_env import (
    CHIEF_ROLE,
    ENV_REPLICA_INDEX,
    ENV_ROLE,
    PS_ROLE,
    hostfile_text,
    mpi_env,
    ps_env,
    tf_config,
)
from tidal.launch.groups.role_slots import RoleShape, assign_roles, fit_shapes
from tidal.launch.launchers import make_group
from tidal.launch.process import Spawner
from tidal.launch.slot_names import join_slots, slot_indices
from tidal.launch.worker import Worker, WorkerIds, WorkerSpec, role_spec
from tidal.model import Launcher, stops_alone
from tidal.policy.role_restart import RoleProgress, job_outcome
from tidal.ps.env import ENV_BIND
from tidal.runtime.rendezvous import Generation, RendezvousHost

__all__ = ["RoleGroups"]

log = logging.getLogger("tidal.launch")

#: Seconds the roles left running get to stop once the job succeeded.
_STOP_GRACE = 10.0


class RoleGroups:
    """Run every role of one job (see the module docstring); drive it like a group."""

    def __init__(
        self,
        spec: WorkerSpec,
        roles: Sequence[RoleLaunch],
        *,
        on_output: Callable[[str, str], None] | None = None,
        on_event: Callable[[GroupEvent], None] | None = None,
        on_failure: Callable[[Worker], None] | None = None,
        spawner: Spawner | None = None,
        store_host: str = "127.0.0.1",
        first_worker_id: int = 0,
        work_dir: Path | None = None,
        network: SlotNetwork | None = None,
    ) -> None:
        """``spec``: what every role shares (the job's run id, logs, checkpoints);
        ``work_dir``: where launcher files (hostfiles, server addresses) go;
        ``network``: where each slot is reached (``tf`` addresses, ``mpi`` hosts), when
        the slots are not all on this machine (default: ``tf`` replicas at ``127.0.0.1``,
        hostfiles naming the slots' hosts)."""
        self.roles = list(roles)
        self.spec = spec
        self.ids = WorkerIds(first_worker_id)
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix=f"tidal-{spec.job_id}-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.shapes = [
            RoleShape(
                r.name,
                r.min,
                r.max,
                stops_alone(r.launcher, r.name, r.min != r.max),
                r.replica_slots,
            )
            for r in self.roles
        ]
        self.assigned: dict[str, list[str]] = {}
        self.outcome: Outcome | None = None
        self._on_event = on_event
        self._network = network
        self._addresses: dict[str, list[str]] = {}
        self.groups: dict[str, Group] = {}
        #: The roles that run as plain replica sets (also in :attr:`groups`).
        self.replica_sets: dict[str, ReplicaSet] = {}
        protocol: JobGroup | None = None
        for role in self.roles:
            if Launcher(role.launcher).forms_group:
                group = make_group(
                    role_spec(spec, role, {ENV_ROLE: role.name}),
                    on_output=on_output,
                    on_event=on_event,
                    on_failure=on_failure,
                    spawner=spawner,
                    store_host=store_host,
                    ids=self.ids,
                )
                protocol = protocol or group
                self.groups[role.name] = group
        self._protocol = protocol
        #: The job's store: the protocol group's, else one of its own.
        self.host = protocol.host if protocol is not None else RendezvousHost(store_host)
        for role in self.roles:
            if Launcher(role.launcher).forms_group:
                continue
            self.groups[role.name] = self.replica_sets[role.name] = ReplicaSet(
                role_spec(spec, role),
                policy=role.policy,
                env_for=self._env_maker(role),
                on_output=on_output,
                on_event=on_event,
                spawner=spawner,
                store=self.host.address,
                ids=self.ids,
            )

    # -- what the driver reads ---------------------------------------------------------

    @property
    def workers(self) -> dict[str, Worker]:
        """Every role's workers by id, each marked with its role and index."""
        out: dict[str, Worker] = {}
        for name, group in self.groups.items():
            slots = self.assigned.get(name, [])
            for worker in group.workers.values():
                worker.role = name
                if worker.index is None and worker.slot in slots:
                    worker.index = slots.index(worker.slot)
                out[worker.id] = worker
        return out

    @property
    def generation(self) -> Generation | None:
        """The protocol role's generation (``None`` when every role is a replica set)."""
        return self._protocol.generation if self._protocol is not None else None

    def poll_interval(self) -> float:
        """The shortest wait any role asks for."""
        return min(g.poll_interval() for g in self.groups.values())

    def settled(self) -> bool:
        """Whether every role runs on its assigned slots."""
        return all(g.settled() for g in self.groups.values())

    # -- orders --------------------------------------------------------------------------

    def start(self, slots: Sequence[str]) -> None:
        """Split ``slots`` among the roles and start each."""
        self.assign(slots)

    def assign(self, slots: Sequence[str]) -> None:
        """Split ``slots`` among the roles (:func:`assign_roles`) and assign each its own;
        a failed replica on a slot that stays gets a new one."""
        self.shapes = fit_shapes(self.shapes, list(slots), self.assigned)
        self.assigned = assign_roles(self.shapes, list(slots), self.assigned)
        for role in self.roles:
            if role.launcher == "mpi":
                self._write_hostfile(role)
        for name, group in self.groups.items():
            group.assign(self.assigned[name])
        self._place_tf()  # before the next poll starts any replica

    def poll(self) -> Outcome | None:
        """Advance every role; the job's outcome once it has one."""
        if self.outcome is not None:
            return self.outcome
        progress: dict[str, RoleProgress] = {}
        for role in self.roles:
            outcome = self.groups[role.name].poll()
            progress[role.name] = RoleProgress(
                ends_job=role.ends_job,
                succeeded=outcome is Outcome.SUCCEEDED,
                failed=outcome is Outcome.FAILED,
            )
        verdict = job_outcome(progress)
        if verdict == "succeeded":
            rest = [r.name for r in self.roles if self.groups[r.name].outcome is None]
            if rest:
                self._emit("finished", f"the job succeeded: stopping {', '.join(rest)}")
            for name in rest:
                self.groups[name].stop(grace=_STOP_GRACE)
            self.outcome = Outcome.SUCCEEDED
        elif verdict == "failed":
            for group in self.groups.values():
                if group.outcome is None:
                    group.fail("another role failed")
            self.outcome = Outcome.FAILED
        return self.outcome

    def fail(self, reason: str) -> None:
        """End the job as failed: every role's processes are killed."""
        for group in self.groups.values():
            group.fail(reason)
        self.outcome = Outcome.FAILED

    def stop(self, grace: float = 30.0) -> None:
        """Stop the roles that end the job first (they may checkpoint through the
        others), then the rest; each gets up to ``grace`` seconds."""
        order = sorted(self.roles, key=lambda r: not r.ends_job)
        for role in order:
            self.groups[role.name].stop(grace=grace)
        if self.outcome is None:
            self.outcome = Outcome.STOPPED

    # -- launcher environments -----------------------------------------------------------

    def _env_maker(self, role: RoleLaunch) -> Callable[[str, int], dict[str, str]]:
        def env_for(slot: str, index: int) -> dict[str, str]:
            env = {ENV_ROLE: role.name, ENV_REPLICA_INDEX: str(index)}
            if role.launcher == "tf":
                env["TF_CONFIG"] = tf_config(self._addresses, role.name, index)
            elif role.launcher == "ps":
                env.update(self._ps_env(role, index))
                env.update(self._ps_bind(role, slot))
            elif role.launcher == "mpi":
                env.update(mpi_env(str(self._hostfile(role)), self._others(role)))
            return env

        return env_for

    def _ps_env(self, role: RoleLaunch, index: int) -> dict[str, str]:
        servers = next((r for r in self.roles if r.name == PS_ROLE), None)
        # the chief reads no data stream: only the workers' count sets the streams
        workers = [r.max for r in self.roles if r.name not in (PS_ROLE, CHIEF_ROLE)] or [1]
        checkpoints = self.spec.checkpoint_dir
        env = ps_env(
            role.name,
            index,
            n_ps=servers.max if servers is not None else 1,
            max_workers=max(workers),
            address_dir=str(self.work_dir / "ps-addresses"),
            checkpoint_dir=str(Path(checkpoints) / "ps") if checkpoints else None,
        )
        # The user's own settings (mode, replicas_to_aggregate, ...) are left as given.
        return {k: v for k, v in env.items() if k not in role.env or k.endswith(("ROLE", "INDEX"))}

    def _place_tf(self) -> None:
        """Give each ``tf`` replica its address on its slot's host: once, at the first
        assignment (a restarted replica keeps it), and anew only where a replica moved to
        another host. Ports are asked for in one batch."""
        network = self._network or LoopbackNetwork()
        wanted: list[tuple[str, int, str, str]] = []
        for role in self.roles:
            group = self.replica_sets.get(role.name)
            if role.launcher != "tf" or group is None:
                continue
            addresses = self._addresses.setdefault(role.name, [""] * role.max)
            for slot, index in group.indices.items():
                host = network.address(slot)
                if index < len(addresses) and addresses[index].rpartition(":")[0] != host:
                    wanted.append((role.name, index, slot, host))
        if not wanted:
            return
        ports = network.free_ports([slot for _, _, slot, _ in wanted])
        for (name, index, _, host), port in zip(wanted, ports, strict=True):
            self._addresses[name][index] = f"{host}:{port}"

    def _ps_bind(self, role: RoleLaunch, slot: str) -> dict[str, str]:
        """A server whose workers may be on other hosts listens on its host's address
        (``tidal.ps`` binds ``127.0.0.1`` by default), unless the job says where."""
        own = {**self.spec.env, **role.env}
        if self._network is None or role.name != PS_ROLE or ENV_BIND in own:
            return {}
        return {ENV_BIND: f"tcp://{self._network.address(slot)}:0"}

    def _others(self, role: RoleLaunch) -> list[str]:
        slots = [s for name, held in self.assigned.items() if name != role.name for s in held]
        if self._network is None:
            return slots
        # Hosts as the launcher's program reaches them: ``address:i``.
        return [join_slots(self._network.address(s), slot_indices(s)) for s in slots]

    def _hostfile(self, role: RoleLaunch) -> Path:
        return self.work_dir / f"hostfile-{role.name}"

    def _write_hostfile(self, role: RoleLaunch) -> None:
        path = self._hostfile(role)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(hostfile_text(self._others(role)))
        tmp.replace(path)

    def _emit(self, kind: str, message: str) -> None:
        log.info("run=%s %s: %s", self.spec.job_id, kind, message)
        if self._on_event is not None:
            self._on_event(GroupEvent(kind, message, time=time.time()))
