"""The share weighting on a module's output: every output tensor's gradient is scaled
once, whatever container the module returns, and the container is returned as it was."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

from tidal.runtime.parallel import scale_output_gradients


class Pair(NamedTuple):
    logits: torch.Tensor
    extra: torch.Tensor


class ModelOutput(OrderedDict[str, torch.Tensor]):
    """A dict subclass with attribute access, as model libraries return."""

    def __getattr__(self, name: str) -> torch.Tensor:
        return self[name]


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: list[torch.Tensor]


#: Each builder wraps the two output tensors (2x and 3x) in a container of its kind.
BUILDERS: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "named tuple": Pair,
    "dict subclass": lambda a, b: ModelOutput(logits=a, extra=b),
    "dataclass": lambda a, b: Output(a, [b]),
    "nested tuple and list": lambda a, b: (a, [b]),
}


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_the_container_keeps_its_type_and_each_tensor_is_scaled(kind: str) -> None:
    x = torch.ones(3, requires_grad=True)
    a, b = x * 2, x * 3
    out = BUILDERS[kind](a, b)
    assert scale_output_gradients(out, 0.25) is out
    torch.autograd.backward([a.sum(), b.sum()])
    assert x.grad is not None
    # d/dx (2x + 3x) = 5, scaled by 0.25.
    assert torch.allclose(x.grad, torch.full((3,), 1.25)), x.grad


def test_a_tensor_returned_twice_is_scaled_once() -> None:
    x = torch.ones(3, requires_grad=True)
    y = x * 2
    scale_output_gradients({"logits": y, "same": y, "again": (y,)}, 0.5)
    torch.autograd.backward([y.sum()])
    assert x.grad is not None
    assert torch.allclose(x.grad, torch.full((3,), 1.0)), x.grad
