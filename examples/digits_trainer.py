"""The digits classifier through ``tidal.Trainer``: no training loop to write.

tidal run --workers 1:4 -- examples/digits_trainer.py --epochs 10
"""

from __future__ import annotations

import argparse
import json

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.utils.data import TensorDataset

import tidal


def digits() -> tuple[TensorDataset, TensorDataset]:
    """Standardised digits, split 80/20 (the same in every worker)."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    scaler = StandardScaler().fit(x_train)  # constant pixels keep unit scale
    return (
        TensorDataset(
            torch.tensor(scaler.transform(x_train), dtype=torch.float32), torch.tensor(y_train)
        ),
        TensorDataset(
            torch.tensor(scaler.transform(x_test), dtype=torch.float32), torch.tensor(y_test)
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--result", help="write the final epoch's figures as JSON here")
    args = parser.parse_args()

    torch.manual_seed(0)
    trainer = tidal.Trainer(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
        datasets=digits,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        scheduler=lambda opt, steps: torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps),
    )
    result = trainer.fit(args.epochs, args.batch_size)
    if tidal.current().rank == 0:
        print(json.dumps(result.final), flush=True)
        if args.result:
            with open(args.result, "w") as fh:
                json.dump(result.final, fh)


if __name__ == "__main__":
    main()
