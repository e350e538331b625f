"""Which group runs a role's workers, by the role's launcher.

``tidal`` (:class:`~tidal.launch.groups.elastic.WorkerGroup`): the rescale protocol,
resized in place at a step boundary. ``torchrun``
(:class:`~tidal.launch.groups.torchrun.TorchrunGroup`): torchrun's environment for
unmodified scripts, resized by restarting every worker.
:class:`~tidal.launch.driver.GroupDriver` drives either as a
:class:`~tidal.launch.groups.api.JobGroup`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal.launch.groups.api import JobGroup
from tidal.launch.groups.elastic import WorkerGroup
from tidal.launch.groups.torchrun import TorchrunGroup
from tidal.launch.worker import WorkerSpec
from tidal.model import Launcher

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tidal.launch.groups.base import GroupBaseOptions

__all__ = ["LAUNCHERS", "RESTART_BASED", "make_group", "resize_mode"]

#: The launchers a role may name.
LAUNCHERS = tuple(launcher.value for launcher in Launcher)
#: Launchers that resize a group by restarting all of its workers.
RESTART_BASED = frozenset(launcher.value for launcher in Launcher if launcher.restart_based)


def resize_mode(launcher: str) -> str:
    """How a group of ``launcher`` resizes, in the words the CLI shows."""
    return Launcher(launcher).resize_mode


def make_group(spec: WorkerSpec, **options: Unpack[GroupBaseOptions]) -> JobGroup:
    """The group that runs ``spec.launcher``'s workers (``options``: see
    :class:`~tidal.launch.groups.base.GroupBase`); ``ValueError`` naming the launcher for
    one tidal does not have."""
    # Each built by name, so that mypy checks both are concrete and are JobGroups.
    if spec.launcher == "tidal":
        return WorkerGroup(spec, **options)
    if spec.launcher == "torchrun":
        return TorchrunGroup(spec, **options)
    raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {spec.launcher!r}")
