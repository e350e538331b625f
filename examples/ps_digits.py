"""Classify scikit-learn's handwritten digits with parameter-server training.

The same script runs every process of the job: under a launcher (``TIDAL_PS_ROLE`` and the
rest of the environment contract in ``tidal.ps.config``), or on its own with ``--local``,
which starts a small job on this machine::

    python examples/ps_digits.py --local --n-ps 2 --workers 3 --mode async --chief

A worker writes one JSON line per pushed batch to ``--out/<worker>.jsonl`` and its final
test accuracy to ``--out/<worker>.json``. The chief (``TIDAL_PS_ROLE=chief``; ``--chief``
with ``--local``) evaluates the current parameters on the test split every
``--eval-every`` seconds until every worker has finished, then saves the final model to
``--out/chief-final.pt`` and its accuracy to ``--out/chief.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import TensorDataset

import tidal.ps


def build_data(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Standardised digits, split 80/20."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    scaler = StandardScaler().fit(x_train)

    def to_set(a: np.ndarray, b: np.ndarray) -> TensorDataset:
        return TensorDataset(
            torch.tensor(scaler.transform(a), dtype=torch.float32), torch.tensor(b)
        )

    return to_set(x_train, y_train), to_set(x_test, y_test)


def build_model(hidden: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    x, y = data.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def optimizer_factory(name: str, lr: float):  # type: ignore[no-untyped-def]
    """The shard optimizer the servers build (``bad`` fails, to show the error path)."""
    if name == "adam":
        return lambda params: torch.optim.Adam(params, lr=lr)
    if name == "bad":
        return lambda params: torch.optim.SGD(params, lr=-1.0)  # torch refuses lr < 0
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    train_set, test_set = build_data(args.seed)
    model = tidal.ps.ParameterServerModel(
        build_model(args.hidden, args.seed), optimizer=optimizer_factory(args.optimizer, args.lr)
    )  # on a ps process: serves its shard here and exits when the job stops it
    if model.is_chief:
        evaluate(model, test_set, args)
        return
    loader = tidal.ps.ShardedLoader(
        train_set, batch_size=args.batch_size, model=model, seed=args.seed
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = dict(model.resume_position or {})
    loss_fn = nn.CrossEntropyLoss()
    with model, open(out / f"{model.worker_id}.jsonl", "a", buffering=1) as trace:
        while loader.epoch < args.epochs:
            for x, y in loader:
                loss = loss_fn(model(x), y)
                loss.backward()
                applied = model.push()
                trace.write(
                    json.dumps(
                        {
                            **(model.data_position or {}),
                            "applied": applied,
                            "loss": round(loss.item(), 4),
                            "t": time.time(),
                        }
                    )
                    + "\n"
                )
                if args.step_delay:
                    time.sleep(args.step_delay)
        model.pull()
        result = {
            "worker": model.worker_id,
            "accuracy": accuracy(model.module, test_set),
            "start": start,
            "stats": model.stats,
        }
    (out / f"{model.worker_id}.json").write_text(json.dumps(result))
    print(json.dumps(result), flush=True)


def evaluate(
    model: tidal.ps.ParameterServerModel, test_set: TensorDataset, args: argparse.Namespace
) -> None:
    """The chief: evaluate as training goes on, save the final model once it is over."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evaluations = []
    with model:
        for version in model.checkpoints(every_seconds=args.eval_every, timeout=args.timeout):
            acc = accuracy(model, test_set)  # the parameters of ``version``
            evaluations.append({"version": version, "accuracy": acc, "t": time.time()})
            print(json.dumps(evaluations[-1]), flush=True)
        path = model.save(out / "chief-final.pt")
        result = {
            "worker": model.worker_id,
            "accuracy": accuracy(model, test_set),
            "version": model.version,
            "evaluations": evaluations,
            "saved": str(path),
        }
    (out / "chief.json").write_text(json.dumps(result))
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=10, help="epochs of each worker's stream")
    parser.add_argument("--batch-size", type=int, default=16, help="per-worker batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "bad"], default="sgd")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--out", default=os.environ.get("TIDAL_PS_OUT", "ps-digits-out"))
    parser.add_argument("--local", action="store_true", help="start a job on this machine")
    parser.add_argument("--n-ps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--chief", action="store_true", help="with --local: start a chief")
    parser.add_argument("--eval-every", type=float, default=2.0, help="chief: seconds")
    parser.add_argument("--timeout", type=float, default=600.0, help="chief: seconds")
    args = parser.parse_args()
    if not args.local:
        train(args)
        return
    workdir = Path(tempfile.mkdtemp(prefix="ps-digits-"))
    config = tidal.ps.PSConfig(n_ps=args.n_ps, mode=args.mode, max_workers=args.workers)
    argv = [a for a in sys.argv[1:] if a not in ("--local", "--chief")]
    argv += ["--out", str(workdir / "out")]
    with tidal.ps.LocalCluster(__file__, config, workdir, args=argv) as cluster:
        cluster.start_servers()
        chief = cluster.start_chief() if args.chief else None
        for i in range(args.workers):
            cluster.start_worker(i)
        codes = cluster.wait_workers(timeout=600)
        if chief is not None:
            codes["chief-0"] = chief.wait(timeout=args.timeout)
    for name, code in codes.items():
        print(
            name,
            "exit",
            code,
            (workdir / "out" / f"{name.rsplit('-', 1)[0]}.json").read_text() if code == 0 else "",
        )
    print("logs:", workdir / "logs")


if __name__ == "__main__":
    main()
