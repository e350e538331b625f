"""What a re-plan costs tidal's loader with worker processes on a decode-bound dataset.

A re-plan happens when the batches in flight were planned for another world, batch size or
position (a rescale, the adaptive batch size choosing another batch, a rollback). The
step taken right after one has to wait for a batch of the new plan to be read; the ideal is
one batch's reading by one worker, which is measured as the baseline: in steady state,
the time per batch the workers deliver times their number (each reads whole batches). The
folder of JPEGs and the dataset are ``benchmarks/loader.py``'s.

Each trial takes a few batches of an epoch (the workers read ahead, as in steady
training), then changes the global batch by one sample and times the ``next()`` after it,
``--changes`` times; medians over all of them.

    PYTHONPATH=src:. python benchmarks/loader_replan.py --trials 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import tidal
from benchmarks.loader import JpegFolder, write_images

#: Batches timed in steady state per epoch, for the baseline.
STEADY = 6


def trial(
    folder: Path, workers: int, prefetch: int, batch: int, changes: int
) -> tuple[list[float], list[float]]:
    """Seconds of the ``next()`` after each batch change, and of one batch read by one
    worker in steady state."""
    loader = tidal.ElasticDataLoader(
        JpegFolder(folder),
        batch_size=batch,
        seed=0,
        num_workers=workers,
        prefetch_factor=prefetch,
        persistent_workers=True,
    )
    replans: list[float] = []
    steady: list[float] = []
    try:
        for epoch in range(changes):
            loader.set_epoch(epoch)
            batches = iter(loader)
            for _ in range(2):  # the workers read ahead, as in steady training
                next(batches)
            started = time.perf_counter()
            for _ in range(STEADY):
                next(batches)
            steady.append((time.perf_counter() - started) / STEADY * workers)
            loader.batch_size = batch + 1 if loader.batch_size == batch else batch
            started = time.perf_counter()
            next(batches)
            replans.append(time.perf_counter() - started)
    finally:
        loader.close()
    return replans, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--changes", type=int, default=8)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tidal-replan-"))
    try:
        write_images(folder, args.images, args.size)
        replans: list[float] = []
        steady: list[float] = []
        for _ in range(args.trials):
            r, f = trial(folder, args.workers, args.prefetch_factor, args.batch_size, args.changes)
            replans += r
            steady += f
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    replan, batch_read = statistics.median(replans), statistics.median(steady)
    print(
        f"{args.workers} workers, prefetch {args.prefetch_factor}, batch {args.batch_size}: "
        f"step after a re-plan {replan * 1e3:.0f} ms, "
        f"one batch read by a worker {batch_read * 1e3:.0f} ms, "
        f"ratio {replan / batch_read:.2f} ({len(replans)} re-plans)"
    )


if __name__ == "__main__":
    main()
