"""Every policy by name: the one table ``tidal server`` and ``tidal sim`` build policies from.

An entry names its factory as ``module:attribute``, imported only when a policy is built,
so reading the table (``tidal server --help``, the simulator's choices) imports no policy
and none of their dependencies (numpy). Options reach a factory by keyword, only those it
declares; ``tidal server --policy-option K=V`` gives them as text (:func:`text_options`).
"""

from __future__ import annotations

import enum
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

from tidal.policy.api import Policy

__all__ = [
    "POLICIES",
    "SERVED",
    "SIMULATED",
    "PolicyEntry",
    "PolicyError",
    "Sizing",
    "declared_options",
    "simulated_policy",
    "text_options",
]


class Sizing(enum.Enum):
    """How the simulator sizes jobs for a policy (see :mod:`tidal.sim.engine`)."""

    FIXED = "fixed"
    ELASTIC = "elastic"
    ADAPTIVE = "adaptive"


class PolicyError(ValueError):
    """A policy name or option that does not exist."""


@dataclass(frozen=True)
class PolicyEntry:
    """One policy: its factory, and what the simulator needs to replay it."""

    #: ``module:attribute`` of the factory (a class or a function).
    target: str
    #: How the simulator sizes this policy's jobs.
    sizing: Sizing
    #: Whether ``tidal server --policy`` offers it (the others calibrate the simulator).
    served: bool = True
    #: Options the simulator builds it with, beyond the reallocation cost.
    simulated: Mapping[str, object] = field(default_factory=dict)

    def factory(self) -> Callable[..., Policy]:
        """The factory, imported now."""
        module, _, attr = self.target.partition(":")
        return cast(Callable[..., Policy], getattr(importlib.import_module(module), attr))


#: Every policy, in the order the simulator compares them (from the baseline up).
POLICIES: Mapping[str, PolicyEntry] = MappingProxyType(
    {
        "static": PolicyEntry("tidal.policy.static:StaticPolicy", Sizing.FIXED),
        "tiresias": PolicyEntry("tidal.policy.tiresias:TiresiasPolicy", Sizing.FIXED),
        "tiresias-artifact": PolicyEntry(
            "tidal.policy.tiresias:TiresiasArtifactPolicy", Sizing.FIXED, served=False
        ),
        "fairshare": PolicyEntry("tidal.policy.fairshare:FairSharePolicy", Sizing.ELASTIC),
        # Simulated jobs always report a throughput model: no prior for jobs that have not.
        "goodput": PolicyEntry(
            "tidal.policy.goodput:live_policy", Sizing.ADAPTIVE, simulated={"prior_sync": None}
        ),
        "goodput-plain": PolicyEntry(
            "tidal.policy.goodput:plain_policy", Sizing.ADAPTIVE, served=False
        ),
    }
)

#: What ``tidal server --policy`` accepts by name, sorted.
SERVED = tuple(sorted(name for name, entry in POLICIES.items() if entry.served))

#: What ``tidal sim`` accepts, in the table's order.
SIMULATED = tuple(POLICIES)


def declared_options(factory: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` that ``factory`` declares: a factory need not take them all."""
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    return {key: value for key, value in options.items() if key in accepted}


def text_options(
    name: str, factory: Callable[..., Any], options: Mapping[str, str]
) -> dict[str, Any]:
    """``options`` given as text (``--policy-option K=V``) for the policy ``name``,
    converted to the type of each parameter's default; an unknown one is an error."""
    if not options:
        return {}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"cannot read the options of policy {name!r}: {exc}") from None
    converted: dict[str, Any] = {}
    for key, text in options.items():
        if key not in accepted:
            choices = ", ".join(accepted) or "none"
            raise PolicyError(f"policy {name!r} has no option {key!r} (options: {choices})")
        default = accepted[key].default
        try:
            converted[key] = (
                type(default)(text)
                if isinstance(default, int | float) and not isinstance(default, bool)
                else text
            )
        except ValueError:
            raise PolicyError(f"policy option {key}: not a number: {text!r}") from None
    return converted


def simulated_policy(name: str, reallocation_cost: float) -> Policy:
    """A fresh policy called ``name`` as the simulator replays it; a factory that takes a
    ``reallocation_delay`` is told what a reallocation costs."""
    entry = POLICIES.get(name)
    if entry is None:
        raise PolicyError(f"unknown policy {name!r}; choose from {', '.join(SIMULATED)}")
    factory = entry.factory()
    options = {"reallocation_delay": reallocation_cost, **entry.simulated}
    return factory(**declared_options(factory, options))
