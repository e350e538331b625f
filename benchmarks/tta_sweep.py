"""Time to accuracy, fairly: every fixed batch at its best learning rate against autoscale.

Protocol (see ``docs/benchmarks.md``, "Time to accuracy, tuned"): for each task of
``benchmarks/tta_tasks.py`` and each fixed global batch, a grid of 5 learning rates
(``lr0 · sqrt(B / B0)`` times 1/4 .. 4, extended by halving or doubling while the best
is at an end), 3 seeds each, SGD with momentum 0.9; the best rate of a batch is the one
with the lowest median time to target. Autoscale starts from the smallest batch that
reached the target, at that batch's best rate, and tunes nothing else:
the runtime's own :class:`~tidal.runtime.adaptive.AdaptiveBatch` estimates the gradient
noise, fits the throughput model, chooses the batch, and gives the AdaScale gain and
progress; :func:`~tidal.runtime.lr_scaling.current_factor` gives the learning rate.
``--variants`` are rules of :func:`~tidal.runtime.lr_scaling.lr_factor`, ``+warmup`` adding
a 10-step warm-up after each batch change.

Everything runs in this one process. ``W`` replicas are emulated by splitting each global
batch into ``W`` shards (at least 2, so the noise estimate has two gradients to compare
also alone), each shard's gradient computed on its own and averaged, exactly the
statistics a rank's gradient hook sees before and after the all-reduce. Time is the
modelled step time of ``tta_tasks`` summed over the steps taken (wall-clock is printed
too): the machine is shared, and its load moves wall-clock by tens of percent.

    PYTHONPATH=src:. python benchmarks/tta_sweep.py --out /tmp/tta
    PYTHONPATH=src:. python benchmarks/tta_sweep.py --tasks digits --seeds 1 --variants adascale
    PYTHONPATH=src:. python benchmarks/tta_sweep.py --fixed-from /tmp/tta/results.json \
        --fixed-seeds 9 --seeds 9 --rescale --variants adascale,sqrt --out /tmp/tta-9
    PYTHONPATH=src:. python benchmarks/tta_sweep.py --fixed-from /tmp/tta/results.json \
        --tasks images --seeds 1 --variants adascale --trace     # each decision, step by step
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from tidal.runtime.adaptive import AdaptiveBatch
from tidal.runtime.context import WorkerContext
from tidal.runtime.lr_scaling import current_factor

try:
    from tta_tasks import TASKS, Task, calibrate
except ImportError:  # run as a module from the repository root
    from benchmarks.tta_tasks import TASKS, Task, calibrate

#: Base learning rate at the smallest batch of each task's grid (centre of its grid).
LR0 = {"digits": 0.05, "teacher": 0.05, "images": 0.02}
LR_MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
#: Rates tried beyond the grid while a batch's best is at its edge (halving or doubling).
MAX_EXTENSION = 3
MAX_LOCAL = 256
#: A run stops once it is this many times slower than the fastest fixed one so far.
LIMIT = 4.0


class _Loader:
    """What :class:`AdaptiveBatch` reads and writes of a loader."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.micro_batch_size: int | None = None


class _Context:
    """What :class:`AdaptiveBatch` reads of a worker context (rank 0 of ``world_size``)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.rank = 0
        self.parallel = None
        self.step = 0


@dataclass
class Run:
    """One configuration's result."""

    seconds: float  # modelled; inf if the target was not reached
    wall: float
    steps: int
    samples: int
    accuracy: float
    curve: list[tuple[float, float]] = field(default_factory=list)  # (seconds, accuracy)
    batches: list[tuple[float, int, int]] = field(default_factory=list)  # (s, batch, world)


def world_at(schedule: list[tuple[float, int]], seconds: float) -> int:
    """Replicas at modelled time ``seconds`` of ``[(from seconds, workers), ...]``."""
    workers = schedule[0][1]
    for start, w in schedule:
        if seconds >= start:
            workers = w
    return workers


def train(
    task: Task,
    batch: int,
    lr: float,
    seed: int,
    schedule: list[tuple[float, int]],
    variant: str | None = None,
    limit: float = math.inf,
    max_global: int = 4096,
    trace: bool = False,
) -> Run:
    """Train one configuration to the task's target; ``variant`` (a rule of
    :func:`lr_factor`, optionally ``+warmup``) switches autoscale on from ``batch``.
    A run still short of the target after ``limit`` modelled seconds stops there.
    ``trace`` prints each step at which autoscale's batch or world changes, and every
    10th step: batch, predicted gain and efficiency, the learning-rate factor, the loss."""
    model = task.build(seed)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x, y = task.train
    x_test, y_test = task.test
    n = len(y)
    loader = _Loader(batch)
    context = _Context(schedule[0][1])
    # The stand-in has what AdaptiveBatch reads of a worker context.
    worker = cast(WorkerContext, context)
    adaptive = AdaptiveBatch(loader, worker, max_global, (1, MAX_LOCAL), True) if variant else None
    rule, *changes = (variant or "adascale").split("+")
    if adaptive is not None:
        adaptive.warmup_steps = 10 if "warmup" in changes else 0
    generator = torch.Generator().manual_seed(seed)
    seconds = 0.0
    wall_start = time.perf_counter()
    steps = samples = 0
    next_eval = task.eval_samples
    accuracy = 0.0
    run = Run(math.inf, 0.0, 0, 0, 0.0)
    traced = (0, 0)
    for epoch in range(task.max_epochs):
        order = torch.randperm(n, generator=generator)
        position = 0
        if adaptive is not None and epoch > 0:
            adaptive.on_epoch()
        while True:
            workers = world_at(schedule, seconds)
            if workers != context.world_size:
                context.world_size = workers
                if adaptive is not None:
                    adaptive.on_generation()
            size = loader.batch_size
            if position + size > n or seconds > limit:
                break
            idx = order[position : position + size]
            position += size
            shards = idx.tensor_split(max(workers, 2))
            total = [torch.zeros_like(p) for p in params]
            local_sqr = []
            loss = 0.0
            for shard in shards:
                model.zero_grad()
                shard_loss = loss_fn(model(x[shard]), y[shard])
                shard_loss.backward()
                loss += float(shard_loss.detach()) * len(shard) / size
                grads = [p.grad for p in params]
                local_sqr.append(float(sum((g * g).sum() for g in grads if g is not None)))
                for t, g in zip(total, grads, strict=True):
                    if g is not None:
                        t.add_(g, alpha=len(shard) / size)
            for p, t in zip(params, total, strict=True):
                p.grad = t
            factor = 1.0
            if adaptive is not None:
                adaptive.note_batch(size // workers, size)
                global_sqr = float(sum((t * t).sum() for t in total))
                inverse = statistics.fmean(1.0 / len(s) for s in shards)
                adaptive.noise.update(statistics.fmean(local_sqr), 1.0 / inverse, global_sqr, size)
                factor = current_factor(adaptive, rule)
                if trace and (steps % 10 == 0 or (size, workers) != traced):
                    traced = (size, workers)
                    gain = adaptive.gain()
                    print(
                        f"    step {steps:>4} {seconds:.4f} s  batch {size:>4} x{workers}  "
                        f"gain {gain:5.2f} eff {gain * adaptive.init_batch / size:4.2f}  "
                        f"lr x{factor:5.2f}  noise {adaptive.noise.noise_scale:7.1f} "
                        f"(n {adaptive.noise.count:>3})  loss {loss:.3f}  acc {accuracy:.3f}",
                        flush=True,
                    )
            for group in optimizer.param_groups:
                group["lr"] = lr * factor
            optimizer.step()
            step, sync = task.step_time(workers, size, MAX_LOCAL)
            seconds += step
            steps += 1
            samples += size
            context.step = steps
            if adaptive is not None:
                adaptive.end_step(timing=(step, sync))
                proposal = adaptive.proposal()
                if proposal:
                    adaptive.apply(proposal)
            if not run.batches or run.batches[-1][1:] != (loader.batch_size, workers):
                run.batches.append((seconds, loader.batch_size, workers))
            if samples >= next_eval:
                next_eval += task.eval_samples
                with torch.no_grad():
                    accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
                run.curve.append((seconds, accuracy))
                if accuracy >= task.target:
                    run.seconds = seconds
                    break
        if math.isfinite(run.seconds) or seconds > limit:
            break
    run.wall = time.perf_counter() - wall_start
    run.steps, run.samples, run.accuracy = steps, samples, accuracy
    return run


def median_time(runs: list[Run]) -> float:
    """Median modelled time to target over seeds (inf counts as not reached)."""
    return statistics.median(r.seconds for r in runs)


def sweep(
    task: Task, seeds: int, schedule: list[tuple[float, int]]
) -> dict[int, tuple[float, list[Run]]]:
    """Each fixed batch at each rate of its grid; keeps the best rate's runs per batch."""
    best: dict[int, tuple[float, list[Run]]] = {}
    b0 = task.fixed[0]
    fastest = math.inf
    # Largest batches first: they are cheap in CPU, and the fastest time so far bounds
    # the rest (a run past LIMIT x the fastest can be neither the best nor decide it).
    for batch in sorted(task.fixed, reverse=True):
        centre = LR0[task.name] * math.sqrt(batch / b0)
        tried: dict[float, float] = {}  # multiplier -> median seconds
        grid = list(LR_MULTIPLIERS)
        while grid:
            mult = grid.pop(0)
            lr = centre * mult
            limit = LIMIT * fastest
            runs = [train(task, batch, lr, s, schedule, limit=limit) for s in range(seeds)]
            t = tried[mult] = median_time(runs)
            fastest = min(fastest, t)
            print(f"  {task.name} fixed {batch:>4} lr {lr:.4f}: {t:.3f} s", flush=True)
            if batch not in best or t < median_time(best[batch][1]):
                best[batch] = (lr, runs)
            if not grid:
                grid = _beyond_the_edge(tried)
    return best


def _beyond_the_edge(tried: dict[float, float]) -> list[float]:
    """The next rate to try when the best so far is at an end of the grid: a best rate
    at the edge is a bound, not a tuned rate (up to :data:`MAX_EXTENSION` more)."""
    reached = {m: t for m, t in tried.items() if math.isfinite(t)}
    if not reached or len(tried) >= len(LR_MULTIPLIERS) + MAX_EXTENSION:
        return []
    best = min(reached, key=lambda m: reached[m])
    if best == min(tried):
        return [best / 2]
    if best == max(tried):
        return [best * 2]
    return []


def summary(name: str, runs: list[Run]) -> dict[str, Any]:
    """Plain data of one configuration's runs (for results.json and the plots)."""
    return {
        "name": name,
        "median_seconds": median_time(runs),
        "seconds": [r.seconds for r in runs],
        "wall": [r.wall for r in runs],
        "steps": [r.steps for r in runs],
        "samples": [r.samples for r in runs],
        "curves": [r.curve for r in runs],
        "batches": [r.batches for r in runs],
    }


def remeasured(
    task: Task,
    fixed: list[dict[str, Any]],
    seeds: int,
    schedule: list[tuple[float, int]],
    limit: float,
) -> list[dict[str, Any]]:
    """The earlier sweep's fixed rows, each batch re-run at its tuned rate over ``seeds``
    seeds when ``seeds`` > 0 (the rate is not re-tuned; more seeds only measure it)."""
    if seeds <= 0:
        return fixed
    out = []
    for c in fixed:
        batch = int(c["name"].split()[1])
        runs = [train(task, batch, c["lr"], s, schedule, limit=limit) for s in range(seeds)]
        print(f"  {task.name} fixed {batch:>4} lr {c['lr']:.4f}: {median_time(runs):.3f} s")
        out.append({**summary(c["name"], runs), "lr": c["lr"], "batch": batch})
    return out


def _earlier(results: str, name: str) -> dict[str, Any]:
    """Task ``name``'s entry of an earlier sweep's results.json."""
    entry: dict[str, Any] = next(
        r for r in json.loads(Path(results).read_text()) if r["task"] == name
    )
    return entry


def _use_model(task: Task, earlier: dict[str, Any]) -> None:
    """Time ``task``'s steps with an earlier sweep's fitted ``alpha`` and ``beta``."""
    task.alpha, task.beta = earlier["model"]["alpha"], earlier["model"]["beta"]


def run_task(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The whole protocol on one task: sweep, autoscale variants, the rescale."""
    task = TASKS[name]()
    calibrate(task)
    if args.model_from:
        # An earlier run's step-time model: its figures and these then compare.
        _use_model(task, _earlier(args.model_from, name))
    fixed_world = [(0.0, args.workers)]
    out: dict[str, Any] = {"task": name, "target": task.target, "configs": []}
    if args.fixed_from:
        # Autoscale variants only: the fixed runs (and their model) of an earlier sweep.
        earlier = _earlier(args.fixed_from, name)
        _use_model(task, earlier)
        fixed = [c for c in earlier["configs"] if c["name"].startswith("fixed")]
        # The earlier sweep's bound on a run (LIMIT x its fastest fixed batch), kept.
        earlier_limit = LIMIT * min(c["median_seconds"] for c in fixed)
        fixed = remeasured(task, fixed, args.fixed_seeds, fixed_world, earlier_limit)
        out["configs"] = fixed
        best = {c["batch"]: (c["lr"], [Run(t, 0, 0, 0, 0) for t in c["seconds"]]) for c in fixed}
        rescaled = earlier.get("rescale")
    else:
        rescaled = None
        best = sweep(task, args.seeds, fixed_world)
        for batch, (lr, runs) in best.items():
            out["configs"].append({**summary(f"fixed {batch}", runs), "lr": lr, "batch": batch})
    out["model"] = {"alpha": task.alpha, "beta": task.beta, "params": task.params}
    print(
        f"{name}: alpha {task.alpha * 1e3:.3f} ms, beta {task.beta * 1e6:.2f} us/sample, "
        f"{task.params} parameters",
        flush=True,
    )
    # The smallest batch whose sweep reached the target: the only small batch with a
    # best rate to start from (AdaScale scales a rate tuned for the initial batch).
    init = min(b for b, (_, runs) in best.items() if math.isfinite(median_time(runs)))
    init_lr = best[init][0]
    out["init"] = {"batch": init, "lr": init_lr}
    limit = LIMIT * min(median_time(r) for _, r in best.values())
    out["limit"] = limit
    for variant in args.variants.split(","):
        runs = [
            train(task, init, init_lr, s, fixed_world, variant, limit, trace=args.trace)
            for s in range(args.seeds)
        ]
        out["configs"].append({**summary(f"autoscale {variant}", runs), "lr": init_lr})
    if args.rescale:
        reference = min(median_time(r) for _, r in best.values())
        schedule = [(0.0, 2), (0.25 * reference, 4), (0.5 * reference, 1)]
        out["rescale"] = {"schedule": schedule, "configs": []}
        if rescaled is not None:
            schedule = [(float(t), int(w)) for t, w in rescaled["schedule"]]
            out["rescale"]["schedule"] = schedule
            out["rescale"]["configs"] = remeasured(
                task,
                [c for c in rescaled["configs"] if c["name"].startswith("fixed")],
                args.fixed_seeds,
                schedule,
                earlier_limit,
            )
        for batch, (lr, _) in best.items() if rescaled is None else ():
            runs = [train(task, batch, lr, s, schedule, limit=limit) for s in range(args.seeds)]
            out["rescale"]["configs"].append({**summary(f"fixed {batch}", runs), "lr": lr})
        for variant in args.variants.split(","):
            runs = [
                train(task, init, init_lr, s, schedule, variant, limit, trace=args.trace)
                for s in range(args.seeds)
            ]
            out["rescale"]["configs"].append({**summary(f"autoscale {variant}", runs)})
    return out


def report(result: dict[str, Any], key: str | None = None) -> None:
    """Print one task's figures: each configuration, and autoscale against the fixed."""
    configs = result[key]["configs"] if key else result["configs"]
    title = f"{result['task']}" + (" under rescale 2 -> 4 -> 1" if key else "")
    print(f"\n{title} (target {result['target']}): modelled seconds to target, medians")
    fixed = {c["name"]: c["median_seconds"] for c in configs if c["name"].startswith("fixed")}
    best_name = min(fixed, key=lambda k: fixed[k])
    middle = statistics.median(fixed.values())
    for c in configs:
        wall = statistics.median(c["wall"])
        line = f"  {c['name']:<22} {c['median_seconds']:8.3f} s  (wall {wall:6.2f} s)"
        if c["name"].startswith("autoscale"):
            ratio = c["median_seconds"] / fixed[best_name]
            line += f"  / best ({best_name}) {ratio:.2f}, / median fixed "
            line += f"{c['median_seconds'] / middle:.2f}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", default="digits,teacher,images")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--variants", default="adascale,adascale+warmup")
    parser.add_argument("--rescale", action="store_true", help="also 2 -> 4 -> 1 workers")
    parser.add_argument(
        "--fixed-from", help="results.json of an earlier sweep: run only the autoscale variants"
    )
    parser.add_argument(
        "--fixed-seeds",
        type=int,
        default=0,
        help="with --fixed-from: re-run each fixed batch at its tuned rate over this many seeds",
    )
    parser.add_argument(
        "--model-from", help="results.json of an earlier sweep: use its step-time model"
    )
    parser.add_argument("--out", default="tta-results", help="results.json goes here")
    parser.add_argument(
        "--trace", action="store_true", help="print autoscale's decisions, step by step"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.tasks.split(","):
        result = run_task(args, name)
        results.append(result)
        report(result)
        if "rescale" in result:
            report(result, "rescale")
        (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"({time.time() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
