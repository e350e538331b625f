"""The policy registry: one table of names for the server and the simulator."""

from __future__ import annotations

import pytest

from tidal.controller.plugins import load_policy
from tidal.policy.goodput import LIVE_PRIOR_SYNC, GoodputPolicy
from tidal.policy.registry import (
    POLICIES,
    SERVED,
    SIMULATED,
    PolicyError,
    Sizing,
    simulated_policy,
)


def test_the_server_offers_the_live_policies_and_the_simulator_every_one() -> None:
    assert SERVED == ("fairshare", "goodput", "static", "tiresias")
    assert SIMULATED == (
        "static",
        "tiresias",
        "tiresias-artifact",
        "fairshare",
        "goodput",
        "goodput-plain",
    )
    assert {POLICIES[name].sizing for name in ("static", "tiresias")} == {Sizing.FIXED}
    assert POLICIES["fairshare"].sizing is Sizing.ELASTIC
    assert POLICIES["goodput-plain"].sizing is Sizing.ADAPTIVE


@pytest.mark.parametrize("name", SIMULATED)
def test_every_entry_builds_a_policy(name: str) -> None:
    policy = simulated_policy(name, reallocation_cost=7.0)
    assert callable(policy.allocate)
    if isinstance(policy, GoodputPolicy):
        assert policy.reallocation_delay == 7.0  # told what a reallocation costs


def test_goodput_runs_with_a_prior_live_and_without_one_in_simulation() -> None:
    live = load_policy("goodput")
    simulated = simulated_policy("goodput", reallocation_cost=30.0)
    assert isinstance(live, GoodputPolicy) and isinstance(simulated, GoodputPolicy)
    assert (live.prior_sync, simulated.prior_sync) == (LIVE_PRIOR_SYNC, None)
    plain = simulated_policy("goodput-plain", reallocation_cost=30.0)
    assert isinstance(plain, GoodputPolicy)
    assert (plain.packed, plain.whole_nodes, plain.service_scale, plain.move_horizon) == (
        False,
        False,
        None,
        None,
    )


def test_an_unknown_name_names_the_choices() -> None:
    with pytest.raises(PolicyError, match="unknown policy 'nope'; choose from static, tiresias"):
        simulated_policy("nope", reallocation_cost=30.0)
