"""The loader with worker processes (world of one): the batches of the training process,
exact resume, stale prefetches dropped, errors raised, no process left behind."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import tidal
from tidal.runtime.data import epoch_order
from tidal.runtime.env import EXIT_RELEASED

N = 103


class Numbered(Dataset[tuple[torch.Tensor, int, int]]):
    """Sample ``i`` is ``(tensor([i, i²]), i, pid of the process that read it)``."""

    def __init__(self, length: int = N, fail_at: int | None = None, die_at: int | None = None):
        self.length, self.fail_at, self.die_at = length, fail_at, die_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        if i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        if i == self.die_at:
            os._exit(3)
        return torch.tensor([float(i), float(i * i)]), i, os.getpid()


def _record(loader: tidal.ElasticDataLoader, batch: Any) -> dict[str, Any]:
    """What a step consumed: the batch's contents and the loader's account of it."""
    span = tidal.current().sample_span
    if len(batch) == 3:  # Numbered: values, ids and the reader's pid (which differs)
        values, ids = batch[0].tolist(), batch[1].tolist()
    else:
        values, ids = [t.tolist() for t in batch], None
    return {
        "epoch": loader.epoch,
        "values": values,
        "ids": ids,
        "indices": loader.last_indices,
        "global": loader.last_global_indices,
        "position": loader.position,
        "span": (span.epoch, span.start, span.count) if span is not None else None,
    }


def _scripted_run(loader: tidal.ElasticDataLoader) -> Iterator[dict[str, Any]]:
    """Two epochs and a half with what changes the plan between steps: a new batch size (as
    the adaptive batch does), a rewind to an earlier state (as a rollback does), a jump to
    another epoch."""
    saved: dict[str, Any] | None = None
    rewound = False
    for epoch in range(2):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            yield _record(loader, batch)
            if epoch == 0 and step == 2:
                loader.batch_size = 7
            if epoch == 0 and step == 4:
                saved = loader.state_dict()
            if epoch == 0 and step == 7 and not rewound:
                rewound = True
                assert saved is not None
                loader.load_state_dict(saved)
    loader.set_epoch(5)
    yield from (_record(loader, batch) for batch in loader)


def _loader(dataset: Any, **options: Any) -> tidal.ElasticDataLoader:
    return tidal.ElasticDataLoader(dataset, batch_size=10, seed=3, **options)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
@pytest.mark.parametrize("kind", ["samples", "tensors"])
def test_workers_give_the_batches_of_the_training_process(kind: str, persistent: bool) -> None:
    dataset: Any = (
        Numbered() if kind == "samples" else TensorDataset(torch.arange(N * 2).view(N, 2))
    )
    alone = list(_scripted_run(_loader(dataset)))
    loader = _loader(dataset, num_workers=2, prefetch_factor=3, persistent_workers=persistent)
    fetched = list(_scripted_run(loader))
    assert fetched == alone
    if kind == "samples":
        # The batch trained is the one the loader accounts for, however far ahead it was
        # fetched: never one planned for the batch size or position before the change.
        assert all(r["ids"] == r["indices"] for r in fetched)
        assert all(r["values"] == [[i, i * i] for i in r["indices"]] for r in fetched)
    assert loader._prefetch is not None and loader._prefetch.replans >= 2
    loader.close()


class Counted(Numbered):
    """:class:`Numbered`, counting the samples read by every process (shared memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = multiprocessing.Value("l", 0)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        with self.reads.get_lock():
            self.reads.value += 1
        return super().__getitem__(i)


def test_persistent_workers_read_no_sample_past_the_epoch_taken() -> None:
    # Reading on into the next epoch costs, after a job's last epoch, the CPU of batches
    # nobody takes; the next epoch's steps are planned when it starts, as a DataLoader's.
    dataset = Counted()
    loader = _loader(dataset, num_workers=2, prefetch_factor=3, persistent_workers=True)
    consumed: list[int] = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        consumed += [i for batch in loader for i in batch[1].tolist()]
        assert loader._prefetch is not None and loader._prefetch.in_flight == 0
    workers = loader._prefetch
    assert workers is not None
    loader.close()
    assert sorted(consumed) == sorted(list(range(N)) * 2)
    assert dataset.reads.value == len(consumed)  # every sample read was taken
    assert workers.replans == 0  # a new epoch is no re-plan: nothing in flight was dropped


class Gated(Counted):
    """:class:`Counted`, whose reads past the first batch wait for :attr:`go`."""

    def __init__(self, first_batch: int) -> None:
        super().__init__()
        self.first_batch = first_batch
        self.go = multiprocessing.Event()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        if self.reads.value >= self.first_batch:
            assert self.go.wait(timeout=60), "the test never let the worker read on"
        return super().__getitem__(i)


def test_a_replan_does_not_wait_for_the_stale_batches_to_be_read() -> None:
    # One persistent worker, 4 steps in flight; the worker holds in the second step's read
    # until the plan has changed. Persistent workers are reused only once they answered
    # everything queued before: reading the 3 stale steps still queued would make the
    # re-plan wait for 30 samples' decoding, each for nothing; and the step being read
    # stops at its next sample.
    dataset = Gated(first_batch=10)
    loader = _loader(dataset, num_workers=1, prefetch_factor=4, persistent_workers=True)
    first = next(loader)[1].tolist()
    prefetcher = loader._prefetch
    assert prefetcher is not None and prefetcher.in_flight == 4
    number = int(prefetcher._dataset.plan)
    loader.batch_size = 7  # as the adaptive batch does: the steps in flight are stale
    taken: list[Any] = []
    replan = threading.Thread(target=lambda: taken.append(next(loader)))
    replan.start()
    deadline = time.monotonic() + 60
    while int(prefetcher._dataset.plan) == number:  # the re-plan has begun
        assert time.monotonic() < deadline, "the loader never re-planned"
        time.sleep(0.005)
    dataset.go.set()
    replan.join(timeout=60)
    assert not replan.is_alive() and len(taken) == 1
    second = taken[0][1].tolist()
    assert prefetcher.replans == 1 and second == loader.last_indices and len(second) == 7
    rest = [i for batch in loader for i in batch[1].tolist()]
    loader.close()
    assert sorted(first + second + rest) == list(range(N))
    # Read and not taken: at most the sample the worker was reading when the plan changed
    # (it stops the stale step there, not at the step's end, nor after 3 more steps).
    assert dataset.reads.value - N <= 1


def test_workers_resume_mid_epoch_exactly() -> None:
    first = _loader(Numbered(), num_workers=2, persistent_workers=True)
    seen = [batch[1].tolist() for _, batch in zip(range(4), first, strict=False)]
    state = first.state_dict()
    first.close()
    resumed = tidal.ElasticDataLoader(Numbered(), batch_size=10, seed=0, num_workers=2)
    resumed.load_state_dict(state)
    rest = [batch[1].tolist() for batch in resumed]
    assert sorted(i for batch in seen + rest for i in batch) == list(range(N))
    assert [i for batch in seen + rest for i in batch] == first.order(0).tolist()


def test_a_failing_sample_raises_in_the_training_process_and_is_not_skipped() -> None:
    loader = _loader(Numbered(fail_at=int(epoch_order(N, 3, True, 0)[25])), num_workers=2)
    consumed = [batch[1].tolist() for _, batch in zip(range(2), loader, strict=False)]
    with pytest.raises(ValueError, match=r"sample \d+ is corrupt"):
        next(loader)
    assert loader.position == 20  # the failed step was not consumed
    assert len(consumed) == 2
    with pytest.raises(ValueError, match="is corrupt"):
        next(loader)  # fetched again, not skipped
    loader.close()


def test_a_dead_worker_raises() -> None:
    loader = _loader(Numbered(die_at=int(epoch_order(N, 3, True, 0)[3])), num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        next(loader)
    loader.close()


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


@pytest.mark.parametrize("how", ["close", "release"])
def test_workers_stop_with_the_loader(how: str) -> None:
    loader = _loader(Numbered(), num_workers=2, persistent_workers=True)
    pids = {pid for _, batch in zip(range(5), loader, strict=False) for pid in batch[2].tolist()}
    assert os.getpid() not in pids and len(pids) == 2
    if how == "close":
        loader.close()
    else:
        del loader  # no reference cycle holds the workers: they stop at once
    assert _alive(pids) == set()


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch.utils.data import Dataset
    import tidal
    from tidal.runtime.leaving import exit_released

    class Pids(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return os.getpid()

    loader = tidal.ElasticDataLoader(
        Pids(), batch_size=4, num_workers=2, persistent_workers=sys.argv[1] == "1"
    )
    pids = {pid for _, batch in zip(range(6), loader) for pid in batch.tolist()}
    print(json.dumps(sorted(pids)), flush=True)
    exit_released()
    """
)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per-epoch"])
def test_a_released_process_leaves_no_loader_worker_behind(
    tmp_path: Path, persistent: bool
) -> None:
    script = tmp_path / "release.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), "1" if persistent else "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_RELEASED, done.stderr
    pids = set(json.loads(done.stdout.splitlines()[-1]))
    assert len(pids) == 2
    # Stopped and reaped before the process ended (an orphaned worker would linger for
    # seconds, until its watchdog noticed its parent gone).
    assert _alive(pids) == set()


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        yield from range(10)


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="dataset: expected a map-style dataset"):
        tidal.ElasticDataLoader(Stream(), batch_size=4)
    with pytest.raises(ValueError, match="num_workers"):
        tidal.ElasticDataLoader(Numbered(), batch_size=4, num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        tidal.ElasticDataLoader(Numbered(), batch_size=4, prefetch_factor=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        tidal.ElasticDataLoader(Numbered(), batch_size=4, persistent_workers=True)
