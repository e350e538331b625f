"""Which group runs a role's workers, by the role's launcher.

``tidal`` (:class:`~tidal.launch.group.WorkerGroup`): the rescale protocol, resized in
place at a step boundary. ``torchrun`` (:class:`~tidal.launch.torchrun.TorchrunGroup`):
torchrun's environment for unmodified scripts, resized by restarting every worker.
Drivers (``tidal run``, :class:`~tidal.launch.driver.GroupDriver`) use either through
what both offer.
"""

from __future__ import annotations

from collections.abc import Callable

from tidal.launch.group import WorkerGroup
from tidal.launch.group_api import GroupEvent
from tidal.launch.process import Spawner
from tidal.launch.torchrun import TorchrunGroup
from tidal.launch.worker import Worker, WorkerSpec
from tidal.model import Launcher

__all__ = ["LAUNCHERS", "RESTART_BASED", "Group", "make_group", "resize_mode"]

#: The launchers a role may name.
LAUNCHERS = tuple(launcher.value for launcher in Launcher)
#: Launchers that resize a group by restarting all of its workers.
RESTART_BASED = frozenset(launcher.value for launcher in Launcher if launcher.restart_based)

Group = WorkerGroup | TorchrunGroup


def resize_mode(launcher: str) -> str:
    """How a group of ``launcher`` resizes, in the words the CLI shows."""
    return Launcher(launcher).resize_mode


def make_group(
    spec: WorkerSpec,
    *,
    on_output: Callable[[str, str], None] | None = None,
    on_event: Callable[[GroupEvent], None] | None = None,
    on_failure: Callable[[Worker], None] | None = None,
    spawner: Spawner | None = None,
    store_host: str = "127.0.0.1",
    first_worker_id: int = 0,
) -> Group:
    """The group that runs ``spec.launcher``'s workers; ``ValueError`` naming the launcher
    for one tidal does not have."""
    kinds: dict[str, type[WorkerGroup] | type[TorchrunGroup]] = {
        "tidal": WorkerGroup,
        "torchrun": TorchrunGroup,
    }
    kind = kinds.get(spec.launcher)
    if kind is None:
        raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {spec.launcher!r}")
    return kind(
        spec,
        on_output=on_output,
        on_event=on_event,
        on_failure=on_failure,
        spawner=spawner,
        store_host=store_host,
        first_worker_id=first_worker_id,
    )
