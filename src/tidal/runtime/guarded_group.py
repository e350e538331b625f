"""A gloo process group whose all-reduce is behind the failure guard.

DDP built over :class:`GuardedGroup` all-reduces its gradient buckets with its own C++
reducer, as plain DDP does: it averages while copying each gradient into its bucket, one
pass over the gradients. A Python comm hook would get the bucket only after that copy, so
weighting it there is a pass of its own (a few percent of a CPU step; see "Steady-state
overhead" in docs/benchmarks.md). What the hook was needed for on gloo is the guard: a gloo
collective blocked on a dead peer fails promptly only on the ranks wired to that peer, and
DDP waits for its bucket's future inside ``backward()``. Here the group hands DDP the
guard's future instead of the collective's, so a broken generation releases
``backward()`` within one watcher poll with the bucket as it was (the step is then
dropped and redone), as the hook did.

Only ``allreduce`` is guarded. The other collectives DDP issues (the bucket order's
broadcast, the parameter shape check) are handed to the wrapped group as they are, and its
gloo backend is registered as this group's own for what DDP asks of a group's backend
(its name, its options).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tidal.runtime.context import WorkerContext

_CPU = torch.device("cpu")


class GuardedGroup(dist.ProcessGroup):
    """``group`` (gloo, CPU tensors) with each all-reduce's future guarded by ``context``."""

    def __init__(self, group: dist.ProcessGroup, context: WorkerContext) -> None:
        # torch's stub lists only the store form; the binding takes (rank, size) as well,
        # and this group needs no store of its own.
        super().__init__(group.rank(), group.size())  # type: ignore[call-arg]
        self._group = group
        self._context = context
        gloo = dist.ProcessGroup.BackendType.GLOO
        self._register_backend(_CPU, gloo, group._get_backend(_CPU))
        self._set_default_backend(gloo)

    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:  # type: ignore[override]
        """The wrapped group's all-reduce; its work's future completes with the reduced
        tensors or, once the generation is known broken, with ``tensors`` as they are."""
        if self._context.failed:
            # A new collective would only block a gloo thread until the timeout; the
            # step's optimizer update is skipped anyway.
            done: torch.futures.Future[Any] = torch.futures.Future()
            done.set_result(tensors)
            return _GuardedWork(done)
        work = (
            self._group.allreduce(tensors) if opts is None else self._group.allreduce(tensors, opts)
        )
        return _GuardedWork(self._context.guard(work.get_future(), lambda: tensors))

    # Handed on explicitly rather than inherited: an inherited method reached from C++
    # looks for a Python override first, and finds one wherever the base class's methods
    # were wrapped (tracing or counting tools); that wrapper calling back into the base
    # method then recursed without end.

    def broadcast(self, *args: Any) -> dist.Work:
        """The wrapped group's broadcast."""
        return self._group.broadcast(*args)

    def allgather(self, *args: Any) -> dist.Work:
        """The wrapped group's all-gather."""
        return self._group.allgather(*args)

    def _allgather_base(self, *args: Any) -> dist.Work:
        return self._group._allgather_base(*args)

    def barrier(self, *args: Any) -> dist.Work:
        """The wrapped group's barrier."""
        return self._group.barrier(*args)


class _GuardedWork(dist.Work):
    """A work whose future is the guard's: what DDP's reducer waits on."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self._future = future

    def get_future(self) -> torch.futures.Future[Any]:
        """The guarded future (the reduced tensors, or the fallback)."""
        return self._future

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the guarded future: the collective, or the generation's failure."""
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        """Whether the guarded future is done."""
        return self._future.done()
