"""The collectives of the step boundary, on the control channel (see
:mod:`tidal.runtime.control`): host numbers in host memory, so a step never waits for the
GPU to drain.

* **The membership agreement.** Each rank contributes the newest generation number its
  watcher has seen and the ranks take the maximum, so they all learn of a change at the
  same step and switch there together. The collective is started at one step and waited
  for at the next, so it overlaps with the step's compute instead of adding a round trip.
  The adaptive batch size's decision and gradient norms ride in the same collective.
* **The failure check.** After a broken generation, the survivors find who holds the
  newest committed state.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.context import PeerLost, WorkerContext


class Agreement:
    """The membership agreement of one worker: at most one collective in flight."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        #: The agreement in flight: its guarded future (``None`` at world 1, where the
        #: maximum over one rank needs no collective) and the values it reduces in place.
        self._flag: tuple[torch.futures.Future[Any] | None, torch.Tensor] | None = None

    def exchange(self, global_step: int, adaptive: AdaptiveBatch | None) -> int | None:
        """Complete the agreement started at an earlier step (returns the generation to
        switch to, if newer than ours) and start this step's (every ``sync_every``
        steps). Raises :class:`PeerLost` if the generation broke."""
        context = self.context
        assert context.generation is not None
        decided: int | None = None
        if self._flag is not None:
            pending, seen = self._flag
            self._flag = None
            context.wait_guarded(pending)
            values = seen.tolist()
            if int(values[0]) > context.generation.number:
                decided = int(values[0])
            if adaptive is not None:
                # Rank 0's batch decision and every rank's gradient norm: the same on all
                # ranks, applied at the same step everywhere.
                adaptive.absorb(values[1:])
        if decided is None and global_step % context.config.sync_every == 0:
            extra = adaptive.agreement_values() if adaptive is not None else []
            # float64 holds generation numbers and batch sizes exactly.
            seen = torch.tensor([float(context.latest_seen), *extra], dtype=torch.float64)
            if context.world_size == 1:
                # The maximum over one rank: no collective, nothing in flight (a broken
                # generation still shows at the next step: wait_guarded checks it).
                self._flag = (None, seen)
            else:
                assert context.control is not None
                future = context.control.all_reduce_max(seen)
                # Guarded from the start, so close() knows it is in flight: a process
                # that exits with a collective pending aborts (SIGABRT) instead of
                # exiting cleanly.
                self._flag = (context.guard(future, lambda: None), seen)
        return decided

    def finish(self) -> None:
        """Complete the collective still in flight (every rank started it), so the process
        can leave its group cleanly."""
        if self._flag is None:
            return
        future, _ = self._flag
        self._flag = None
        # Training is over: a peer that already left changes nothing.
        with contextlib.suppress(PeerLost):
            self.context.wait_guarded(future)

    def drop(self) -> None:
        """Forget the collective in flight (its generation is being left)."""
        self._flag = None

    def newest_state(self, global_step: int, has_state: bool) -> int | None:
        """After a failure: the rank holding the newest committed state (the lowest such
        rank), or ``None`` when every member already holds the same one (all at the same
        step, no newcomer), so that nothing needs to be sent.

        Survivors differ by at most the broken step: with a ring all-reduce one rank can
        complete the step's gradient sync (and commit the step on the full gradient) while
        another's fails. The step's update is then the same wherever it was committed, so
        the others adopt it: taking rank 0's older state instead would make the ranks that
        committed the step train it a second time."""
        context = self.context
        world, rank = context.world_size, context.rank
        step = global_step if has_state else -1
        # One all-reduce (max) answers both: the newest step with, among its holders, the
        # lowest rank (the key's low digits), and the oldest step (negated).
        key = (step + 1) * world + (world - 1 - rank)
        values = torch.tensor([key, -step, 0 if has_state else 1], dtype=torch.long)
        assert context.control is not None
        context.wait(context.control.all_reduce_max(values))
        newest_key, lowest, missing = (int(v) for v in values.tolist())
        newest = newest_key // world - 1
        if newest == -lowest and missing == 0:
            return None
        if newest < 0:
            return 0  # nobody holds a state: rank 0 resumes from the checkpoint
        return world - 1 - newest_key % world
