"""Autoscaling on Ray: from a job wanting more slots to training on a node added for it.

A real local Ray cluster whose autoscaler starts and stops nodes
(``tests/backends/ray_autoscaling.py``: a head of 4 ``tidal_slot``, at most one more node of
4, Ray's fake multi-node provider, idle timeout 3 s) and ``tidal server --backend ray
--autoscale --max-slots 8`` on it. One job of tests/scripts/elastic_digits.py
(``--workers 1:8``, held at 4) trains on the head. Each trial scales it to 8
(``tidal scale``): the server asks Ray for 8 slots, a node is added and the job grows onto
it; then back to 4, and the idle node is removed before the next trial.

* **asked**: the ``autoscale`` event in which the server asked for 8 slots;
* **node**: the ``cluster`` event in which the new node's slots appeared;
* **trains**: the first step the job trained at world 8 after the trial began (its step
  lines are stamped with ``time.time()``), i.e. with the new node's workers;
* **released**: from the scale back to 4 to the node's slots leaving the cluster.

The baseline, in the same run, on the same cluster, after each trial (the job back at 4 on
the head): Ray's own route to a node, without tidal. 4 actors of one ``tidal_slot`` each,
which wait for a node, whose one method imports torch and takes one SGD step on digits;
from their creation to every step done. That is what Ray's autoscaler does from pending
demand, and what any system on Ray pays for a node and a cold Python with torch: the
ratio is tidal's cost on top.

    PYTHONPATH=src:. python benchmarks/ray_autoscale.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, env
from tests.backends.ray_autoscaling import SLOTS_PER_NODE, autoscaling_cluster, wait_until
from tests.controller.live import start_server, stop_server

from tidal.client import Client

SCRIPT = ROOT / "tests" / "scripts" / "elastic_digits.py"


def _spec(out: Path) -> dict[str, Any]:
    return {
        "name": "grow",
        "command": [
            "python",
            str(SCRIPT),
            "--out",
            str(out),
            "--epochs",
            "100000",
            "--step-delay",
            "0.05",
        ],
        "workers": {"min": 1, "max": 8, "initial": SLOTS_PER_NODE},
    }


def _first_at_world(out: Path, world: int, after: float) -> float | None:
    """When the job first completed a step at ``world`` workers after ``after`` (``None``:
    not yet). Each worker's file is read from its end: the step lines are many."""
    times = []
    for path in out.glob("steps-*.jsonl"):
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 400_000))
            lines = fh.read().decode(errors="replace").splitlines()
        for line in lines:
            if line.startswith("{") and line.endswith("}"):
                record = json.loads(line)
                if record["world"] == world and float(record["time"]) > after:
                    times.append(float(record["time"]))
                    break
    return min(times) if times else None


def _event_after(client: Client, kind: str, since_id: int, test: object) -> tuple[int, float]:
    for event in sorted(client.events(limit=1000), key=lambda e: e.id):
        if event.id > since_id and event.kind == kind and test(event):  # type: ignore[operator]
            return event.id, event.time
    raise LookupError(kind)


def _tidal_trial(client: Client, job: str, out: Path) -> tuple[float, float, float]:
    """(asked → node, asked → trains on it, scaled back → node released) in seconds."""
    last = max((e.id for e in client.events(limit=1000)), default=0)
    began = time.time()
    client.scale(job, 2 * SLOTS_PER_NODE)
    wait_until(lambda: _first_at_world(out, 2 * SLOTS_PER_NODE, began) is not None, 600, "world 8")
    _, asked = _event_after(client, "autoscale", last, lambda e: e.data["wanted_slots"] == 8)
    _, node = _event_after(client, "cluster", last, lambda e: True)
    trains = _first_at_world(out, 2 * SLOTS_PER_NODE, began)
    assert trains is not None
    shrunk = time.time()
    client.scale(job, SLOTS_PER_NODE)
    wait_until(lambda: client.cluster().total_slots == SLOTS_PER_NODE, 300, "the node released")
    return node - asked, trains - asked, time.time() - shrunk


def _baseline_trial(address: str) -> float:
    """Ray alone: 4 one-slot actors (the head is full), each one SGD step; creation →
    every step done."""
    import ray

    @ray.remote(num_cpus=0, resources={"tidal_slot": 1})
    class Trainer:
        def step(self) -> float:
            import torch
            from sklearn.datasets import load_digits

            x, y = load_digits(return_X_y=True)
            model = torch.nn.Linear(64, 10)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loss = torch.nn.functional.cross_entropy(
                model(torch.tensor(x[:64], dtype=torch.float32)), torch.tensor(y[:64])
            )
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            return float(loss)

    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        began = time.time()
        actors = [Trainer.remote() for _ in range(SLOTS_PER_NODE)]  # type: ignore[attr-defined]
        ray.get([a.step.remote() for a in actors], timeout=600)
        took = time.time() - began
        for actor in actors:
            ray.kill(actor)
        return took
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    # Short: Ray's socket paths under it must stay within 107 bytes.
    base = args.out or Path(tempfile.mkdtemp(prefix="tras-", dir="/tmp"))
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    os.environ.update(env())
    tidal_rows: list[tuple[float, float, float]] = []
    baseline: list[float] = []
    with autoscaling_cluster(base / "ray") as cluster:
        os.environ.update(cluster.env)
        server = start_server(
            base,
            "--backend",
            "ray",
            "--ray-address",
            cluster.address,
            "--autoscale",
            "--max-slots",
            "8",
            env=cluster.env,
        )
        try:
            with Client(data_dir=base / "data", timeout=30) as client:
                out = base / "job"
                out.mkdir()
                job = client.submit(_spec(out)).id
                wait_until(
                    lambda: _first_at_world(out, SLOTS_PER_NODE, 0.0) is not None,
                    900,
                    "the job training on the head's 4 slots",
                )
                for trial in range(args.trials):
                    try:
                        row = _tidal_trial(client, job, out)
                    except TimeoutError as exc:
                        # A loaded machine can keep a node from starting: say so, go on.
                        print(f"trial {trial}: tidal: {exc}", flush=True)
                        client.scale(job, SLOTS_PER_NODE)
                        continue
                    tidal_rows.append(row)
                    print(
                        f"trial {trial}: tidal asked → node {row[0]:.1f}s, → training on it "
                        f"{row[1]:.1f}s; released {row[2]:.1f}s after the job shrank "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                    took = _baseline_trial(cluster.address)
                    baseline.append(took)
                    wait_until(
                        lambda: client.cluster().total_slots == SLOTS_PER_NODE,
                        300,
                        "the baseline's node released",
                    )
                    print(
                        f"trial {trial}: Ray alone, actors → stepped {took:.1f}s "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        finally:
            stop_server(server)
    load = os.getloadavg()
    if not tidal_rows or not baseline:
        print(f"no trial completed | load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        return
    nodes, trains, released = zip(*tidal_rows, strict=True)
    tidal_median, baseline_median = statistics.median(trains), statistics.median(baseline)
    print(
        f"asked → training on the new node: tidal p50 {tidal_median:.1f}s "
        f"(max {max(trains):.1f}s; node joined p50 {statistics.median(nodes):.1f}s; "
        f"released p50 {statistics.median(released):.1f}s after the job shrank) | "
        f"Ray alone p50 {baseline_median:.1f}s (max {max(baseline):.1f}s) | "
        f"ratio {tidal_median / baseline_median:.2f} | {len(tidal_rows)} trials | "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


if __name__ == "__main__":
    main()
