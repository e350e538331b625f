"""Data for parameter-server workers: one stream per worker, its position kept by the job.

Each epoch's shuffled order (seeded by ``seed + epoch``, the same in every process) is
dealt into ``streams`` streams (``streams`` = the job's ``max_workers``); worker ``k``
reads stream ``k``. After every batch the loader tells the model its position (epoch and
batches done), which travels with the gradient to server 0 and is checkpointed with its
shard; a worker that rejoins under the same id resumes after the last batch whose
gradient reached the servers, so it does not repeat samples of the epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from tidal.ps.worker import ParameterServerModel


class ShardedLoader:
    """Batches of this worker's stream of ``dataset``, resuming at its saved position."""

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        model: ParameterServerModel,
        seed: int = 0,
        shuffle: bool = True,
        streams: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: expected at least 1, got {batch_size}")
        if model.spec.role == "chief":
            raise ValueError("model: the chief reads no data stream (only workers train)")
        self.dataset = dataset
        self.batch_size = batch_size
        self.model = model
        self.seed = seed
        self.shuffle = shuffle
        self.streams = streams or model.spec.config.max_workers
        self.stream = model.spec.index
        if self.stream >= self.streams:
            raise ValueError(
                f"streams: worker {self.stream} needs more than {self.streams} streams"
            )
        saved = model.resume_position or {}
        self.epoch = int(saved.get("epoch", 0))
        self.batch = int(saved.get("batch", 0))  # batches of this epoch already done

    def indices(self, epoch: int) -> list[int]:
        """This worker's sample indices in ``epoch``, in order."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            order = torch.arange(n)
        return order[self.stream :: self.streams].tolist()

    def __len__(self) -> int:
        """Batches in one epoch of this stream."""
        return -(-len(self.indices(self.epoch)) // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch; the next iteration starts the next epoch."""
        mine = self.indices(self.epoch)
        while self.batch * self.batch_size < len(mine):
            start = self.batch * self.batch_size
            batch = default_collate(
                [self.dataset[i] for i in mine[start : start + self.batch_size]]
            )
            self.batch += 1
            self.model.data_position = {"epoch": self.epoch, "batch": self.batch}
            yield batch
        self.epoch, self.batch = self.epoch + 1, 0
        self.model.data_position = {"epoch": self.epoch, "batch": 0}
