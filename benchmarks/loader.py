"""How fast tidal's loader feeds a decode-bound job, against ``torch.utils.data.DataLoader``.

A folder of JPEGs is written at run time with PIL (``--images`` files of ``--size`` pixels
square, noisy gradients so that they do not compress to nothing). The dataset opens each
file, decodes it, takes a random 224-pixel crop, flips it at random and makes a float
tensor of it: the work of a torchvision ``ImageFolder`` with ``RandomResizedCrop`` +
``ToTensor``, without torchvision.

Each trial reads ``--epochs`` epochs, shuffled, in global batches of ``--batch-size``, through
``tidal.ElasticDataLoader(num_workers=W)`` (a world of one: the whole global batch is this
process's) and through ``DataLoader(num_workers=W, shuffle=True)``, at every ``W`` of
``--workers``, with ``persistent_workers`` and (``--device cuda``) ``pin_memory`` and a
non-blocking copy to the GPU. The clock runs from the loader's creation (worker start-up
included, for both) to the last batch in hand (on the GPU: copied). The two loaders
alternate, each trial in the other order; samples/s and the ratio are medians over trials,
with the median of the per-trial ratios beside them (each pairs two runs next to each other
in time, so it moves less with other users' load).
CPU time per sample (the training process and its loader workers, counted once the workers
have been stopped and reaped) is printed beside it: on a shared machine it moves much less
with other users' load than samples/s does. So is the number of samples the workers read
per sample taken (counted in shared memory by the dataset): above 1, a loader read samples
that nobody took, whose CPU counts in the CPU per sample.

    PYTHONPATH=src python benchmarks/loader.py --trials 5
    PYTHONPATH=src python benchmarks/loader.py --device cuda --workers 0,4,8 --trials 5
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import tidal

CROP = 224


def write_images(folder: Path, count: int, size: int, classes: int = 10) -> None:
    """``count`` JPEGs in ``classes`` sub-folders, seeded."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    for i in range(count):
        label = i % classes
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        base = ramp[None, :, None] * rng.random(3, dtype=np.float32)
        noise = rng.normal(0, 40, (size, size, 3)).astype(np.float32)
        pixels = np.clip(base + ramp[:, None, None] * 0.3 + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / str(label) / f"{i:05d}.jpg", quality=90)


class JpegFolder(Dataset[tuple[torch.Tensor, int]]):
    """Decode, random crop, random flip, to a float tensor in [0, 1], CHW; ``reads`` counts
    the samples read by every process (shared memory, inherited by forked workers)."""

    def __init__(self, folder: Path) -> None:
        self.items = sorted((path, int(path.parent.name)) for path in folder.glob("*/*.jpg"))
        self.reads = multiprocessing.Value("q", 0)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        with self.reads.get_lock():
            self.reads.value += 1
        with Image.open(path) as opened:
            image = opened.convert("RGB")
            width, height = image.size
            left, top = random.randint(0, width - CROP), random.randint(0, height - CROP)
            image = image.crop((left, top, left + CROP, top + CROP))
            if random.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
        return pixels.permute(2, 0, 1).float().div_(255), label


def consume(batches: Iterable[Any], device: torch.device) -> int:
    """Read every batch (copied to ``device`` unless already there); returns samples."""
    count = 0
    for images, _labels in batches:
        images = images.to(device, non_blocking=True)
        count += int(images.shape[0])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return count


def cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the loaders' workers)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_torch(dataset: JpegFolder, workers: int, args: argparse.Namespace) -> tuple[int, float]:
    """``--epochs`` epochs through ``torch.utils.data.DataLoader``; samples and seconds."""
    device = torch.device(args.device)
    started = time.perf_counter()
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
    )
    count = sum(consume(loader, device) for _ in range(args.epochs))
    elapsed = time.perf_counter() - started
    del loader  # its workers stop here, outside the clock
    return count, elapsed


def run_tidal(dataset: JpegFolder, workers: int, args: argparse.Namespace) -> tuple[int, float]:
    """``--epochs`` epochs through ``tidal.ElasticDataLoader``; samples and seconds."""
    device = torch.device(args.device)
    started = time.perf_counter()
    loader = tidal.ElasticDataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=device.type == "cuda",
    )
    count = 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        count += consume(loader, device)
    elapsed = time.perf_counter() - started
    loader.close()  # its workers stop here, outside the clock
    return count, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=320, help="image side in pixels")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per trial")
    parser.add_argument("--workers", default="0,2,4", help="num_workers values, comma-separated")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    # tidal moves batches to its worker's device: the one asked for here.
    os.environ["TIDAL_BACKEND"] = "nccl" if args.device == "cuda" else "gloo"
    torch.set_num_threads(1)
    tidal.init()  # the process's context (a world of one), made once, outside the clock
    # More workers than cores is what the comparison asks for on a small machine.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    folder = Path(tempfile.mkdtemp(prefix="tidal-loader-bench-"))
    try:
        started = time.perf_counter()
        write_images(folder, args.images, args.size)
        dataset = JpegFolder(folder)
        print(
            f"{len(dataset)} JPEGs of {args.size}x{args.size} written in "
            f"{time.perf_counter() - started:.1f} s; batch {args.batch_size}, "
            f"{args.epochs} epoch(s) a trial, "
            f"device {args.device}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        rates: dict[tuple[str, int], list[float]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        read: dict[tuple[str, int], list[float]] = {}
        for trial in range(args.trials):
            for workers in counts:
                order = [("torch", run_torch), ("tidal", run_tidal)]
                if trial % 2:
                    order.reverse()
                for name, run in order:
                    dataset.reads.value = 0
                    cpu_before = cpu_seconds()
                    count, elapsed = run(dataset, workers, args)
                    per_sample = (cpu_seconds() - cpu_before) / count * 1e3
                    rates.setdefault((name, workers), []).append(count / elapsed)
                    cpu.setdefault((name, workers), []).append(per_sample)
                    read.setdefault((name, workers), []).append(dataset.reads.value / count)
                    print(
                        f"trial {trial} workers {workers} {name:5s} "
                        f"{count / elapsed:8.1f} samples/s {per_sample:6.2f} CPU ms/sample "
                        f"{dataset.reads.value / count:5.3f} read/taken",
                        flush=True,
                    )
        print(f"\nmedians over {args.trials} trials (load {os.getloadavg()[0]:.1f} at the end)")
        print(
            f"{'num_workers':>11}  {'DataLoader':>10}  {'tidal':>10}  {'ratio':>6}  "
            f"{'per trial':>9}  {'CPU ms/sample: DataLoader':>25}  {'tidal':>6}  "
            f"{'read/taken: DataLoader':>22}  {'tidal':>6}"
        )
        for workers in counts:
            base = statistics.median(rates[("torch", workers)])
            ours = statistics.median(rates[("tidal", workers)])
            base_cpu = statistics.median(cpu[("torch", workers)])
            ours_cpu = statistics.median(cpu[("tidal", workers)])
            base_read = statistics.median(read[("torch", workers)])
            ours_read = statistics.median(read[("tidal", workers)])
            paired = statistics.median(
                a / b
                for a, b in zip(rates[("tidal", workers)], rates[("torch", workers)], strict=True)
            )
            print(
                f"{workers:>11}  {base:>10.1f}  {ours:>10.1f}  {ours / base:>6.3f}  "
                f"{paired:>9.3f}  {base_cpu:>25.2f}  {ours_cpu:>6.2f}  "
                f"{base_read:>22.3f}  {ours_read:>6.3f}"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
