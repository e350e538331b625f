"""The digits classifier as a WMLA elastic distributed training script, on tidal.

Written as WMLA's scripts are (``FabricModel(...).train(epochs, batch_size,
engines_number)``, hyperparameters from the training form through ``getEpoch()``,
``getTrainBatchSize()``, ``getOptimizer(model)``), with tidal's module in the import:

    tidal run --workers 1:4 -- examples/wmla_digits.py
    TIDAL_PARAMS='{"epochs": 3, "optimizer": "Adam", "lr": 0.01}' python examples/wmla_digits.py
"""

from __future__ import annotations

import argparse
import json

import torch
from digits_trainer import digits
from torch import nn

import tidal
from tidal.compat.wmla import FabricModel, getEpoch, getOptimizer, getTrainBatchSize


class Net(nn.Module):
    """A small MLP over the 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--result", help="write the final epoch's figures as JSON here")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    fabric = FabricModel(model, digits, nn.CrossEntropyLoss(), getOptimizer(model, lr=0.05))
    result = fabric.train(getEpoch(8), getTrainBatchSize(64), engines_number=4)
    if tidal.current().rank == 0:
        print(json.dumps(result.final), flush=True)
        if args.result:
            with open(args.result, "w") as fh:
                json.dump(result.final, fh)


if __name__ == "__main__":
    main()
