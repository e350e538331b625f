"""The policies the simulator can replay, by name, with the job sizing each one expects."""

from __future__ import annotations

from tidal.policy.api import Policy
from tidal.policy.fairshare import FairSharePolicy
from tidal.policy.goodput import GoodputPolicy
from tidal.policy.static import StaticPolicy
from tidal.policy.tiresias import TiresiasArtifactPolicy, TiresiasPolicy
from tidal.sim.engine import Sizing

#: Policy name -> how the simulator sizes that policy's jobs.
SIZING = {
    "static": Sizing.FIXED,
    "tiresias": Sizing.FIXED,
    "tiresias-artifact": Sizing.FIXED,
    "fairshare": Sizing.ELASTIC,
    "goodput": Sizing.ADAPTIVE,
    "goodput-plain": Sizing.ADAPTIVE,
}

POLICY_NAMES = tuple(SIZING)


def build_policy(name: str, reallocation_cost: float) -> Policy:
    """A fresh policy called ``name``; ``goodput`` is told what a reallocation costs."""
    if name == "static":
        return StaticPolicy()
    if name == "tiresias":
        return TiresiasPolicy()
    if name == "tiresias-artifact":
        return TiresiasArtifactPolicy()
    if name == "fairshare":
        return FairSharePolicy()
    if name == "goodput":
        return GoodputPolicy(reallocation_delay=reallocation_cost)
    if name == "goodput-plain":
        # Pollux's rules alone: no repacking, any size, no attained-service weighting, no
        # move horizon.
        return GoodputPolicy(
            reallocation_delay=reallocation_cost,
            packed=False,
            whole_nodes=False,
            service_scale=None,
            move_horizon=None,
        )
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
