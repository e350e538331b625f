"""The workloads of ``benchmarks/gpu_overhead.py``: models, their synthetic data and loss.

* ``mlp-2m``, ``mlp-50m``: ``examples/synthetic_mlp.py``'s MLP (2 hidden layers) of 2 M and
  50 M parameters on its teacher-labelled Gaussian vectors, batch 512 and 4096;
* ``resnet18``: a ResNet-18 (written here: torchvision is not needed) on random 224x224
  images, 1000 classes, batch 128;
* ``transformer``: a causal language model of 4 pre-norm blocks, d=512, 8 heads, sequence
  256, vocabulary 8192, on random tokens, batch 32.

``--quick`` shrinks each to a few thousand parameters and a few samples (a smoke run on a
CPU). Data are made on the device they are read from, from a fixed seed, so every system
(plain loop, DDP, tidal) trains the same model on the same samples.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from synthetic_mlp import INPUTS, build_model


@dataclass(frozen=True)
class Workload:
    """One model with its data: what a run trains, and how long it is measured."""

    name: str
    #: Global batch (world 1: the one process's batch).
    batch: int
    #: Steps run before timing starts (not counted), then steps timed.
    warmup: int
    steps: int
    #: Steps in an epoch (the dataset holds ``batch * epoch_steps`` samples).
    epoch_steps: int
    build: Callable[[torch.device], nn.Module]
    data: Callable[[int, torch.device, int], TensorDataset]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# -- MLP ---------------------------------------------------------------------------------


def _mlp_data(samples: int, device: torch.device, seed: int) -> TensorDataset:
    """``synthetic_mlp.build_data``, drawn on ``device``: Gaussian inputs labelled by a
    fixed random linear teacher."""
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(samples, INPUTS, generator=g, device=device)
    teacher = torch.randn(INPUTS, 10, generator=g, device=device)
    return TensorDataset(x, (x @ teacher).argmax(1))


def _mlp(name: str, params: float, batch: int, warmup: int, steps: int) -> Workload:
    return Workload(
        name,
        batch,
        warmup,
        steps,
        epoch_steps=16,
        build=lambda device: build_model(params, 2, seed=0),
        data=_mlp_data,
        loss=F.cross_entropy,
    )


# -- ResNet-18 ---------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, and the shortcut (a 1x1 projection when the
    shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """He et al.'s ResNet-18 (11.7 M parameters at width 64 and 1000 classes), as
    torchvision builds it: a 7x7 stem, four stages of two basic blocks, global pooling."""

    def __init__(self, classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        cin = width
        for stage, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**stage
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        logits: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return logits


def _resnet(
    name: str, width: int, image: int, classes: int, batch: int, warmup: int, steps: int
) -> Workload:
    def data(samples: int, device: torch.device, seed: int) -> TensorDataset:
        g = torch.Generator(device).manual_seed(seed)
        x = torch.randn(samples, 3, image, image, generator=g, device=device)
        return TensorDataset(x, torch.randint(classes, (samples,), generator=g, device=device))

    def build(device: torch.device) -> nn.Module:
        torch.manual_seed(0)
        return ResNet18(classes, width)

    return Workload(name, batch, warmup, steps, 8, build, data, F.cross_entropy)


# -- transformer -------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyLM(nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and the vocabulary
    head: next-token logits for every position."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        logits: torch.Tensor = self.head(self.norm(self.blocks(h)))
        return logits


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _transformer(
    name: str,
    vocab: int,
    d: int,
    layers: int,
    heads: int,
    seq: int,
    batch: int,
    warmup: int,
    steps: int,
) -> Workload:
    def data(samples: int, device: torch.device, seed: int) -> TensorDataset:
        g = torch.Generator(device).manual_seed(seed)
        tokens = torch.randint(vocab, (samples, seq + 1), generator=g, device=device)
        return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    def build(device: torch.device) -> nn.Module:
        torch.manual_seed(0)
        return TinyLM(vocab, d, layers, heads, seq)

    return Workload(name, batch, warmup, steps, 16, build, data, _lm_loss)


# -- the table ---------------------------------------------------------------------------

MODELS = ("mlp-2m", "mlp-50m", "resnet18", "transformer")


def workload(name: str, quick: bool = False) -> Workload:
    """The workload ``name`` (one of :data:`MODELS`); ``quick``: its tiny version."""
    if quick:
        table = {
            "mlp-2m": lambda: _mlp(name, 2e4, 64, 3, 12),
            "mlp-50m": lambda: _mlp(name, 1e5, 256, 3, 12),
            "resnet18": lambda: _resnet(name, 8, 32, 10, 8, 3, 12),
            "transformer": lambda: _transformer(name, 256, 64, 2, 4, 32, 8, 3, 12),
        }
    else:
        table = {
            "mlp-2m": lambda: _mlp(name, 2e6, 512, 50, 400),
            "mlp-50m": lambda: _mlp(name, 5e7, 4096, 10, 60),
            "resnet18": lambda: _resnet(name, 64, 224, 1000, 128, 10, 40),
            "transformer": lambda: _transformer(name, 8192, 512, 4, 8, 256, 32, 10, 60),
        }
    if name not in table:
        raise ValueError(f"--models: unknown model {name!r}; expected some of {', '.join(MODELS)}")
    return table[name]()
