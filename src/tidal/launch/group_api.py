"""What every group of workers reports to whoever drives it: how it ended
(:class:`Outcome`) and what happened on the way (:class:`GroupEvent`)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

__all__ = ["GroupEvent", "Outcome"]


class Outcome(enum.Enum):
    """How a group ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class GroupEvent:
    """Something that happened to the group, for logs and the controller's event table."""

    kind: str  # started, admitted, released, failed, restarted, generation, finished
    message: str
    time: float = field(default_factory=time.time)
    generation: int | None = None
    stall: float | None = None
