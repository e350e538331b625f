"""A multi-role job's slots split among its roles, and each launcher's environment."""

from __future__ import annotations

import json

import pytest

from tidal.launch.role_env import hostfile_text, hosts_text, mpi_env, ps_env, tf_config
from tidal.launch.role_slots import RoleShape, assign_roles, fit_shapes, replica_indices
from tidal.ps.config import ClusterSpec

PS = RoleShape("ps", 2, 2)
CHIEF = RoleShape("chief", 1, 1)
WORKER = RoleShape("worker", 1, 4)
SLOTS = [f"h:{i}" for i in range(6)]


def test_fixed_roles_take_their_counts_and_the_elastic_role_the_rest() -> None:
    split = assign_roles([CHIEF, PS, WORKER], SLOTS[:5])
    assert split == {"chief": ["h:0"], "ps": ["h:1", "h:2"], "worker": ["h:3", "h:4"]}
    # The elastic role stops at its max.
    assert assign_roles([CHIEF, PS, WORKER], [*SLOTS, "h:6", "h:7"])["worker"] == [
        "h:3",
        "h:4",
        "h:5",
        "h:6",
    ]


def test_a_resize_never_moves_a_fixed_role() -> None:
    before = {"chief": ["h:4"], "ps": ["h:0", "h:5"], "worker": ["h:1", "h:2", "h:3"]}
    # Shrink: the policy took h:2 and h:3 away.
    shrunk = assign_roles([CHIEF, PS, WORKER], ["h:0", "h:1", "h:4", "h:5"], before)
    assert shrunk == {"chief": ["h:4"], "ps": ["h:0", "h:5"], "worker": ["h:1"]}
    # Grow: the new slots all go to the elastic role, whose kept slots stay first.
    grown = assign_roles([CHIEF, PS, WORKER], ["h:0", "h:1", "h:4", "h:5", "h:6", "h:7"], shrunk)
    assert grown == {"chief": ["h:4"], "ps": ["h:0", "h:5"], "worker": ["h:1", "h:6", "h:7"]}


def test_a_fixed_role_that_lost_a_slot_refills_from_free_slots_first() -> None:
    before = {"ps": ["h:0", "h:1"], "worker": ["h:2", "h:3"]}
    # h:1's host left; the policy gave h:4 instead.
    after = assign_roles([PS, WORKER], ["h:0", "h:2", "h:3", "h:4"], before)
    assert after == {"ps": ["h:0", "h:4"], "worker": ["h:2", "h:3"]}


def test_a_fixed_role_whose_replicas_were_stopped_runs_fewer_and_others_stay() -> None:
    before = {"ps": ["h:0"], "worker": ["h:1", "h:2", "h:3"]}
    server, workers = RoleShape("ps", 1, 1), RoleShape("worker", 3, 3, shrinkable=True)
    # The controller stopped the worker on h:2 for good: one slot short, lost by worker.
    shapes = fit_shapes([server, workers], ["h:0", "h:1", "h:3"], before)
    assert shapes == [server, RoleShape("worker", 2, 2, shrinkable=True)]
    split = assign_roles(shapes, ["h:0", "h:1", "h:3"], before)
    assert split == {"ps": ["h:0"], "worker": ["h:1", "h:3"]}
    # An agent started afresh on the job's slots knows of no loss: the shrinkable role
    # is the one that runs fewer.
    assert fit_shapes([server, workers], ["h:0", "h:1", "h:3"], {}) == shapes
    # A slot lost while the count stays (a host left) is refilled, the shapes unchanged.
    assert fit_shapes([server, workers], ["h:0", "h:1", "h:3", "h:9"], before) == [
        server,
        workers,
    ]
    # A role that cannot run fewer (servers) is never cut: too few slots stay an error.
    with pytest.raises(ValueError, match="'ps'"):
        roles = fit_shapes([RoleShape("ps", 2, 2), workers], ["h:1", "h:2", "h:3"], before)
        assign_roles(roles, ["h:1", "h:2", "h:3"], before)


def test_too_few_slots_is_an_error_naming_the_role() -> None:
    with pytest.raises(ValueError, match="'ps'"):
        assign_roles([CHIEF, PS, WORKER], ["h:0", "h:1"])
    with pytest.raises(ValueError, match="'worker'"):
        assign_roles([CHIEF, PS, WORKER], ["h:0", "h:1", "h:2"])
    with pytest.raises(ValueError, match="at most one elastic"):
        assign_roles([WORKER, RoleShape("eval", 1, 2)], SLOTS)


def test_replica_indices_are_stable_and_a_replacement_takes_the_freed_index() -> None:
    first = replica_indices(["a", "b", "c"], {})
    assert first == {"a": 0, "b": 1, "c": 2}
    # b left, d came: d takes b's data stream, a and c keep theirs.
    assert replica_indices(["a", "c", "d"], first) == {"a": 0, "c": 2, "d": 1}


def test_tf_config_is_what_the_tfjob_operator_writes() -> None:
    addresses = {
        "worker": ["127.0.0.1:2002", "127.0.0.1:2003"],
        "chief": ["127.0.0.1:2000"],
        "ps": ["127.0.0.1:2001"],
        "evaluator": ["127.0.0.1:2004"],
    }
    text = tf_config(addresses, "worker", 1)
    assert text == (
        '{"cluster":{"chief":["127.0.0.1:2000"],"ps":["127.0.0.1:2001"],'
        '"worker":["127.0.0.1:2002","127.0.0.1:2003"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}'
    )
    # The evaluator is told its task but is no member of the training cluster.
    evaluator = json.loads(tf_config(addresses, "evaluator", 0))
    assert evaluator["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" not in evaluator["cluster"]


def test_ps_env_is_the_contract_tidal_ps_reads() -> None:
    server = ClusterSpec.from_env(ps_env("ps", 1, n_ps=2, max_workers=4, address_dir="/tmp/a"))
    assert (server.role, server.index, server.config.n_ps) == ("ps", 1, 2)
    worker = ClusterSpec.from_env(
        {
            **ps_env("worker", 3, n_ps=2, max_workers=4, address_dir="/tmp/a", checkpoint_dir="/c"),
            "TIDAL_PS_MODE": "async",
        }
    )
    assert (worker.role, worker.index, worker.worker_id) == ("worker", 3, "worker-3")
    assert (worker.address_dir, worker.config.max_workers) == ("/tmp/a", 4)
    assert (worker.config.mode, worker.config.checkpoint_dir) == ("async", "/c")
    chief = ClusterSpec.from_env(ps_env("chief", 0, n_ps=2, max_workers=4, address_dir="/a"))
    assert (chief.role, chief.index, chief.worker_id) == ("chief", 0, "chief")


def test_mpi_hostfile_and_host_list() -> None:
    slots = ["a:0", "a:1", "b:0"]
    assert hostfile_text(slots) == "a slots=2\nb slots=1\n"
    assert hosts_text(slots) == "a:2,b:1"
    env = mpi_env("/job/hostfile", slots)
    assert env["TIDAL_HOSTFILE"] == env["OMPI_MCA_orte_default_hostfile"] == "/job/hostfile"
    assert env["TIDAL_HOSTS"] == "a:2,b:1"
