"""A new worker's first step: started cold, or handed to a warm interpreter.

A slot handed to a job is worth something once its new worker has trained a step. The
warm pool (``tidal.launch.warm``) saves the interpreter's start and ``import torch``; on a
GPU host it may not initialise CUDA before the worker's ``CUDA_VISIBLE_DEVICES`` arrives,
so the CUDA context is still made by the worker itself. This measures where the time of a
worker's start goes, for both kinds of start, alternating, with the spawners the runtime
uses (``LocalSpawner`` cold, ``WarmSpawner`` warm, its interpreter ready before the clock
starts):

* **to script**: the spawn call → the script's first line runs (the interpreter);
* **imports**: → ``import torch`` done (a warm interpreter did it ahead);
* **device**: → the device is ready (on CUDA: the context made, a tensor on the GPU);
* **first step**: → a small MLP's first forward, backward and optimizer step is done
  (the device synchronised), i.e. the kernels' first launches and allocations too.

    PYTHONPATH=src:. python benchmarks/first_step.py --device cuda --trials 5
    PYTHONPATH=src:. python benchmarks/first_step.py --device cpu --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tidal.launch.process import LocalSpawner
from tidal.launch.warm import WarmSpawner

#: The worker: stamps when its script starts, when the device is ready, when one training
#: step is done, into the JSON file named by its first argument.
WORKER = """\
import time
started = time.time()
import json, sys
import torch
from torch import nn
imported = time.time()
out, device_name = sys.argv[1], sys.argv[2]
device = torch.device(device_name)
x = torch.zeros(1, device=device)
if device.type == "cuda":
    torch.cuda.synchronize()
device_ready = time.time()
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data, target = torch.randn(512, 256, device=device), torch.randint(0, 10, (512,), device=device)
nn.functional.cross_entropy(model(data), target).backward()
optimizer.step()
if device.type == "cuda":
    torch.cuda.synchronize()
with open(out, "w") as f:
    json.dump(
        {"started": started, "imported": imported, "device": device_ready, "step": time.time()}, f
    )
"""

PHASES = ("to script", "imports", "device", "first step")


def _one(spawner: LocalSpawner | WarmSpawner, script: Path, device: str, work: Path) -> list[float]:
    """Spawn one worker; seconds from the spawn call to each of :data:`PHASES`."""
    out = work / f"stamps-{time.monotonic_ns()}.json"
    env = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    lines: list[str] = []
    began = time.time()
    process = spawner.spawn(
        worker_id="first-step",
        slot="0",
        argv=[sys.executable, str(script), str(out), device],
        env=env,
        cwd=str(work),
        on_line=lines.append,
    )
    code = process.wait(timeout=300)
    process.drain(timeout=5)
    if code != 0 or not out.exists():
        raise RuntimeError(f"worker exited {code}: {' | '.join(lines[-5:])}")
    stamps = json.loads(out.read_text())
    return [stamps[key] - began for key in ("started", "imported", "device", "step")]


def main() -> None:
    """Alternate cold and warm starts; print each phase's median for both, and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", help="write every trial's figures here")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials: expected at least 1")

    results: dict[str, list[list[float]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="tidal-first-step-") as tmp:
        work = Path(tmp)
        script = work / "worker.py"
        script.write_text(WORKER)
        cold = LocalSpawner()
        for trial in range(args.trials):
            order = ("cold", "warm") if trial % 2 == 0 else ("warm", "cold")
            for kind in order:
                if kind == "cold":
                    results[kind].append(_one(cold, script, args.device, work))
                    continue
                pool = WarmSpawner(1, refill=False)
                try:
                    if pool.wait_warm(timeout=120) < 1:
                        raise RuntimeError("the warm interpreter did not get ready in 120 s")
                    results[kind].append(_one(pool, script, args.device, work))
                finally:
                    pool.close()
            row = "  ".join(
                f"{k} " + "/".join(f"{v:.2f}" for v in results[k][-1]) for k in ("cold", "warm")
            )
            print(f"trial {trial + 1}: {row}  (s: {', '.join(PHASES)})", flush=True)

    print(f"\nmedians over {args.trials} trials, seconds from the spawn call ({args.device}):")
    print(f"{'phase':<12}{'cold':>8}{'warm':>8}{'warm/cold':>11}")
    summary: dict[str, dict[str, float]] = {}
    for i, phase in enumerate(PHASES):
        cold_s = statistics.median(r[i] for r in results["cold"])
        warm_s = statistics.median(r[i] for r in results["warm"])
        summary[phase] = {"cold": cold_s, "warm": warm_s}
        print(f"{phase:<12}{cold_s:>8.3f}{warm_s:>8.3f}{warm_s / cold_s:>11.2f}")
    device_share = [r[3] - r[1] for r in results["warm"]]
    print(
        f"warm: imports done → first step done {statistics.median(device_share):.3f} s "
        "(the device's set-up and the first step, which the pool does not do ahead)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": args.device, "trials": results, "medians": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
