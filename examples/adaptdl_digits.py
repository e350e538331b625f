"""AdaptDL's MNIST tutorial script, on the digits, run by tidal: only the import changed.

import tidal.compat.adaptdl as adl        # was: import adaptdl.torch as adl

tidal run --workers 1:4 -- examples/adaptdl_digits.py --epochs 8
python examples/adaptdl_digits.py --epochs 2          # alone, as one worker
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from digits_trainer import digits
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import tidal
import tidal.compat.adaptdl as adl


class Net(nn.Module):
    """A small MLP over the 8x8 digits, with MNIST's log-softmax output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(
    args: argparse.Namespace,
    model: nn.Module,
    train_loader: adl.AdaptiveDataLoader,
    optimizer: optim.Optimizer,
    epoch: int,
    progress: adl.Accumulator,
) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        progress["samples"] += len(data)  # this worker's share; summed over the job
        if batch_idx % args.log_interval == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx}/{len(train_loader)}]\tLoss: {loss.item():.6f}"
            )


def test(model: nn.Module, test_loader: adl.AdaptiveDataLoader) -> tuple[float, float]:
    model.eval()
    stats = adl.Accumulator()
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            stats["test_loss"] += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            stats["correct"] += pred.eq(target.view_as(pred)).sum().item()
    with stats.synchronized():
        size = len(test_loader.dataset)  # type: ignore[arg-type]
        test_loss, accuracy = stats["test_loss"] / size, stats["correct"] / size
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {accuracy:.1%}\n")
    return test_loss, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--autoscale", action="store_true", help="AdaptDL's step 3")
    parser.add_argument("--result", help="write the last epoch's figures as JSON here")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_set, test_set = digits()
    train_loader = adl.AdaptiveDataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    test_loader = adl.AdaptiveDataLoader(test_set, batch_size=args.test_batch_size)
    if args.autoscale:
        train_loader.autoscale_batch_size(512, local_bsz_bounds=(16, 128))

    model: nn.Module = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    adl.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    model = adl.AdaptiveDataParallel(model, optimizer, scheduler)

    progress = adl.Accumulator()  # training samples seen by the whole job, all epochs
    row: dict[str, float] = {}
    for epoch in adl.remaining_epochs_until(args.epochs):
        train(args, model, train_loader, optimizer, epoch, progress)
        _, accuracy = test(model, test_loader)
        scheduler.step()
        with progress.synchronized():
            samples = progress["samples"]
        workers = tidal.current().world_size
        row = {"epoch": epoch, "accuracy": accuracy, "samples": samples, "workers": workers}
    if args.result and tidal.current().rank == 0:
        with open(args.result, "w") as fh:
            json.dump(row, fh)


if __name__ == "__main__":
    main()
