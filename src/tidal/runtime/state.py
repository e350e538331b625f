"""The training state and the step boundary, where membership changes happen.

``State.step()`` commits the step, then takes part in the membership agreement (see
:mod:`tidal.runtime.agreement`), on the generation's control channel: the ranks all learn
of a change at the same step and switch there together.

Failure: when a gradient all-reduce breaks, the optimizer step is skipped (model and
optimizer stay as committed), the small per-step state is rolled back, and the survivors
form the next generation and adopt the newest committed state (a survivor whose gradient
sync completed may have committed the step the others lost). At most the step in flight is
redone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import torch

from tidal.runtime import checkpoint, rollback
from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.agreement import Agreement
from tidal.runtime.context import PeerLost, WorkerContext, current
from tidal.runtime.data import ElasticDataLoader
from tidal.runtime.leaving import exit_released
from tidal.runtime.parallel import ElasticDataParallel
from tidal.runtime.rendezvous import Generation
from tidal.runtime.rollback import Stateful, StepSnapshot
from tidal.runtime.transfer import broadcast_state

log = logging.getLogger("tidal.runtime")


class State:
    """Everything a job must carry across membership changes and restarts.

    Pass the model, optimizer, loader and LR scheduler you train with (and any other object
    with ``state_dict``/``load_state_dict`` as a keyword); put plain values you want kept in
    :attr:`extras`. Call :meth:`step` once per optimizer step, after ``optimizer.step()``.

    With mixed precision, pass the ``torch.amp.GradScaler`` as ``scaler``: its scale
    travels with the state (to newcomers and into checkpoints) and is put back with a
    failed step. A step whose gradients the scaler found inf/NaN (it skips
    ``optimizer.step()``) is a step like any other, with no update.
    """

    def __init__(
        self,
        model: ElasticDataParallel | torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loader: ElasticDataLoader | None = None,
        scheduler: Stateful | None = None,
        *,
        scaler: torch.amp.GradScaler | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every_steps: int | None = None,
        checkpoint_every_seconds: float | None = None,
        keep_checkpoints: int = 2,
        **objects: Stateful,
    ) -> None:
        self.context: WorkerContext = current()
        config = self.context.config
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.scheduler = scheduler
        self.scaler = scaler
        self.objects = dict(objects)
        #: Plain values kept with the state (must be picklable).
        self.extras: dict[str, Any] = {}
        self.checkpoint_dir = checkpoint_dir or config.checkpoint_dir
        self.checkpoint_every_steps = (
            config.checkpoint_every_steps
            if checkpoint_every_steps is None
            else checkpoint_every_steps
        )
        self.checkpoint_every_seconds = (
            config.checkpoint_every_seconds
            if checkpoint_every_seconds is None
            else checkpoint_every_seconds
        )
        self.keep_checkpoints = keep_checkpoints
        #: Optimizer steps committed by the job (all workers together count one per step).
        self.global_step = 0
        self._epoch = 0
        self._has_state = False
        self._commit: StepSnapshot | None = None
        self._agreement = Agreement(self.context)
        self._checkpoint_clock = checkpoint.CheckpointClock()
        #: Seconds from the end of the last step at the old size to the first at the new.
        self.last_rescale_stall: float | None = None
        #: Whether this step's ``optimizer.step()`` ran on a complete gradient.
        self._stepped = False
        #: Called at a planned membership change on every member of the generation that
        #: ends, at the same step, before any member leaves, while its group still works:
        #: the place to gather what a leaving worker holds outside this state.
        self.before_switch: list[Callable[[], None]] = []
        if optimizer is not None:
            rollback.skip_failed_steps(optimizer, self.context, self._mark_stepped)

    # -- the loop -----------------------------------------------------------------------

    @property
    def _adaptive(self) -> AdaptiveBatch | None:
        """The loader's adaptive batch size, if autoscaling is on."""
        return self.loader.adaptive if self.loader is not None else None

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self.loader.epoch if self.loader is not None else self._epoch

    def epochs(self, count: int) -> Iterator[int]:
        """Yield epoch numbers up to ``count``, resuming wherever the job's state is."""
        self.start()
        while self.epoch < count:
            self.context.epoch = self.epoch
            yield self.epoch
            if self.loader is not None:
                self.loader.set_epoch(self.loader.epoch + 1)
            else:
                self._epoch += 1
        self.finish()

    def finish(self) -> None:
        """Complete the agreement collective still in flight (every rank started it), so
        the process can leave its group cleanly. :meth:`epochs` calls it at the end."""
        self._agreement.finish()

    def start(self) -> None:
        """Join the job (waiting to be admitted if it already runs) and adopt its state."""
        if self.context.is_member:
            return
        self._enter(self.context.join(after=self.context.latest_seen, newcomer=True))

    def step(self) -> None:
        """The step boundary: commit, agree on membership, switch generation if asked."""
        context = self.context
        stepped, self._stepped = self._stepped, False
        if context.failed:
            if stepped:
                # The failure came after this step's optimizer step, which ran on the
                # complete gradient: the step stands. Rolling back the data position
                # here would apply this step's update twice.
                self._commit_step()
                self._recover(rollback=False)
            else:
                # The gradient sync of this step broke; the optimizer step was skipped.
                self._recover(rollback=True)
            return
        self._commit_step()
        self._maybe_checkpoint()
        try:
            target = self._agree()
        except PeerLost:
            self._recover(rollback=False)
            return
        if target is not None:
            self._switch(target)

    def _commit_step(self) -> None:
        self.global_step += 1
        self.context.step = self.global_step
        if self._adaptive is not None:
            self._adaptive.end_step()
        self._snapshot()

    def _mark_stepped(self) -> None:
        self._stepped = True

    # -- agreement ----------------------------------------------------------------------

    def _agree(self) -> int | None:
        return self._agreement.exchange(self.global_step, self._adaptive)

    def _switch(self, number: int) -> None:
        context = self.context
        stalled_from = time.perf_counter()
        generation = context.rendezvous.generation(number)
        for hook in self.before_switch:
            hook()
        if context.worker_id not in generation.members:
            self._leave(generation)
        self._detach()
        self._enter(context.join(after=number - 1, newcomer=False))
        self.last_rescale_stall = time.perf_counter() - stalled_from

    def _leave(self, generation: Generation) -> NoReturn:
        if not generation.members and self.context.rank == 0:
            self.save_checkpoint()  # released down to zero workers: resume from here later
        log.info(
            "released worker=%s at step=%d (gen=%d)",
            self.context.worker_id,
            self.global_step,
            generation.number,
        )
        self._detach()
        self.context.close()  # every broken group released before the process ends
        exit_released()

    def _detach(self) -> None:
        self._agreement.drop()
        if isinstance(self.model, ElasticDataParallel):
            self.model.release()
        self.context.teardown()

    def _enter(self, generation: Generation) -> None:
        """Train in ``generation``: adopt the state it trains from if anyone needs it."""
        context = self.context
        while True:
            if context.worker_id not in generation.members:
                self._leave(generation)
            try:
                source = self._sync_source(generation)
                if source is not None:
                    self._sync(source)
                if isinstance(self.model, ElasticDataParallel):
                    self.model.rebuild()
                if self._adaptive is not None:
                    self._adaptive.on_generation()
                context.mark_formed()
                self._snapshot()
                return
            except PeerLost as exc:
                log.warning("gen=%d lost a peer while forming: %s", generation.number, exc)
                self._detach()
                generation = context.join(after=generation.number, newcomer=False)

    def _sync_source(self, generation: Generation) -> int | None:
        """The rank whose state every member adopts, or ``None`` when all hold it already."""
        # Every member must take the same branch: the failure check is a collective.
        if generation.reason == "failure" and generation.number > 0:
            return self._newest_state()
        if not self._has_state or generation.reason != "resize" or generation.number == 0:
            return 0
        previous = self.context.rendezvous.generation(generation.number - 1)
        return 0 if set(generation.members) - set(previous.members) else None

    def _newest_state(self) -> int | None:
        """After a failure: the rank whose committed state is newest (``None``: all equal)."""
        return self._agreement.newest_state(self.global_step, self._has_state)

    def _sync(self, source: int) -> None:
        context = self.context
        if context.rank == source and not self._has_state:
            self._resume_from_checkpoint()
        payload = self.state_dict() if context.rank == source else None
        received = broadcast_state(payload, context, src=source)
        if context.rank != source:
            self.load_state_dict(received, restore_rng=False)
            # Fork this rank's random stream from the source's, so ranks stay distinct.
            torch.manual_seed(int(received["rng"]["torch"][:8].sum().item()) * 7919 + context.rank)
        self._has_state = True

    # -- failure ------------------------------------------------------------------------

    def _recover(self, *, rollback: bool) -> None:
        context = self.context
        generation = context.generation
        assert generation is not None
        log.warning(
            "recovering worker=%s gen=%d step=%d rollback=%s: %s",
            context.worker_id,
            generation.number,
            self.global_step,
            rollback,
            context.failure,
        )
        stalled_from = time.perf_counter()
        context.rendezvous.report_fault(generation.number)
        self._detach()
        if rollback:
            self._restore_snapshot()
        self._enter(context.join(after=generation.number, newcomer=False))
        self.last_rescale_stall = time.perf_counter() - stalled_from

    def _snapshot(self) -> None:
        self._commit = StepSnapshot.take(
            self.global_step,
            self._epoch,
            loader=self.loader,
            scheduler=self.scheduler,
            optimizer=self.optimizer,
            objects=self.objects,
            extras=self.extras,
            scaler=self.scaler,
        )

    def _restore_snapshot(self) -> None:
        commit = self._commit
        assert commit is not None
        self.global_step = commit.global_step
        self.context.step = self.global_step
        self._epoch = commit.epoch
        self.extras = rollback.copy_state(commit.extras)
        commit.put_back(
            loader=self.loader,
            scheduler=self.scheduler,
            optimizer=self.optimizer,
            objects=self.objects,
            scaler=self.scaler,
        )

    # -- state and checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The whole training state (what a newcomer receives and a checkpoint holds)."""
        return {
            "global_step": self.global_step,
            "epoch": self._epoch,
            "model": self.model.state_dict() if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            # Reads the scale from the device: at a rescale or a checkpoint, not per step.
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "loader": self.loader.state_dict() if self.loader is not None else None,
            "objects": {name: obj.state_dict() for name, obj in self.objects.items()},
            "extras": self.extras,
            "rng": rollback.all_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any], *, restore_rng: bool = True) -> None:
        """Adopt a state from :meth:`state_dict`."""
        self.global_step = int(state["global_step"])
        self._epoch = int(state["epoch"])
        self.context.step = self.global_step
        if self.model is not None and state["model"] is not None:
            self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.loader is not None and state["loader"] is not None:
            self.loader.load_state_dict(state["loader"])
        for name, obj in self.objects.items():
            if name in state["objects"]:
                obj.load_state_dict(state["objects"][name])
        self.extras = dict(state["extras"])
        if restore_rng:
            rollback.restore_all_rng(state["rng"])

    def save_checkpoint(self) -> None:
        """Write a durable checkpoint now (rank 0 only; a no-op without a directory)."""
        if self.checkpoint_dir is None or self.context.rank != 0:
            return
        checkpoint.save_atomic(
            self.state_dict(), self.checkpoint_dir, self.global_step, keep=self.keep_checkpoints
        )
        self._checkpoint_clock.reset(self.global_step)

    def _maybe_checkpoint(self) -> None:
        if self.checkpoint_dir is None or self.context.rank != 0:
            return
        every_steps, every_seconds = self.checkpoint_every_steps, self.checkpoint_every_seconds
        if not self._checkpoint_clock.due(self.global_step, every_steps, every_seconds):
            return
        try:
            self.save_checkpoint()
        except Exception as exc:
            if not checkpoint.disk_full(exc):
                raise
            # A full disk costs this checkpoint, not the training: the next one is tried
            # when it is due again, and the latest complete one stays.
            log.warning("checkpoint at step %d skipped: %s", self.global_step, exc)
            self._checkpoint_clock.reset(self.global_step)

    def _resume_from_checkpoint(self) -> None:
        if self.checkpoint_dir is None:
            return
        state = checkpoint.load_latest(self.checkpoint_dir)
        if state is not None:
            self.load_state_dict(state)
            self._checkpoint_clock.last_step = self.global_step
