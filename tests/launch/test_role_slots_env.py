"""A multi-role job's slots split among its roles, and each launcher's environment."""

from __future__ import annotations

import json

import pytest

from tidal.launch.groups.role_env import hostfile_text, hosts_text, mpi_env, ps_env, tf_config
from tidal.launch.groups.role_slots import (
    RoleShape,
    assign_roles,
    fit_shapes,
    group_replicas,
    replica_indices,
)
from tidal.launch.groups.torchrun_env import TorchrunWorld, torchrun_env
from tidal.launch.slot_names import (
    format_slot,
    format_slots,
    member_names,
    parse_slots,
    slot_host,
    slot_indices,
    status_slots,
)
from tidal.launch.worker import WorkerSpec, worker_env
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


def test_workers_of_several_gpus_are_formed_on_one_host_and_keep_their_slots() -> None:
    slots = ["a:0", "a:1", "a:2", "b:0", "b:1", "b:2", "b:3"]
    # A host's odd slot is left unused: a worker never spans two hosts.
    assert group_replicas(slots, 2) == ["a:0,1", "b:0,1", "b:2,3"]
    # A worker whose slots all stay keeps them; the others are formed from what is left.
    assert group_replicas(["a:0", "a:1", "a:2", "a:3"], 2, ["a:1,2"]) == ["a:1,2", "a:0,3"]
    # One of its slots gone: the worker is formed afresh from what its host still has.
    assert group_replicas(["a:0", "a:1", "a:3"], 2, ["a:1,2", "a:0,3"]) == ["a:0,3"]
    assert group_replicas(slots, 1, ["x"]) == slots
    assert member_names("a:1,2") == ["a:1", "a:2"] and member_names("a:1") == ["a:1"]
    assert parse_slots("h:2,3") == (("h", 2), ("h", 3))
    assert format_slots([("h", 2), ("h", 3)]) == "h:2,3"
    assert status_slots("h:2,3") == {"slot": ("h", 2), "slots": (("h", 2), ("h", 3))}
    assert status_slots("h:2") == {"slot": ("h", 2), "slots": ()}


def test_slot_names_read_back_what_they_write() -> None:
    assert format_slot(("h", 3)) == "h:3" and parse_slots("h:3") == (("h", 3),)
    # A host name with colons (an IPv6 address): the indices follow the last one.
    assert parse_slots(format_slots([("::1", 0), ("::1", 1)])) == (("::1", 0), ("::1", 1))
    # Indices are kept as written where only the string matters (GPU UUIDs).
    assert (slot_host("local:GPU-1a"), slot_indices("local:GPU-1a")) == ("local", ["GPU-1a"])


def test_roles_of_several_gpus_split_by_whole_replicas() -> None:
    chief = RoleShape("chief", 1, 1, size=2)
    ps = RoleShape("ps", 2, 2)
    worker = RoleShape("worker", 1, 3, size=2)
    slots = ["a:0", "a:1", "a:2", "a:3", "b:0", "b:1", "b:2", "b:3"]
    split = assign_roles([chief, ps, worker], slots)
    assert split == {"chief": ["a:0,1"], "ps": ["a:2", "a:3"], "worker": ["b:0,1", "b:2,3"]}
    # Growing keeps every replica where it runs.
    more = assign_roles([chief, ps, worker], [*slots, "c:0", "c:1"], split)
    assert more == {**split, "worker": ["b:0,1", "b:2,3", "c:0,1"]}
    # A host lost: the chief moves to whole slots elsewhere, the elastic role shrinks.
    moved = assign_roles([chief, ps, worker], ["a:2", "a:3", "b:0", "b:1", "b:2", "b:3"], split)
    assert moved["ps"] == ["a:2", "a:3"]
    assert len(moved["chief"]) == 1 and moved["worker"] in (["b:0,1"], ["b:2,3"])
    with pytest.raises(ValueError, match="2 slot"):
        assign_roles([chief, ps, worker], ["a:0", "b:0", "c:0", "d:0", "e:0"])
    # Too few slots for every fixed replica: a shrinkable role of size 2 runs one fewer.
    servers = RoleShape("server", 2, 2, shrinkable=True, size=2)
    fitted = fit_shapes([servers, worker], ["a:0", "a:1", "b:0", "b:1"], {})
    assert [(r.name, r.max, r.size) for r in fitted] == [("server", 1, 2), ("worker", 3, 2)]


def test_a_worker_of_several_gpus_sees_all_of_them() -> None:
    spec = WorkerSpec(argv=["x"], job_id="r", gpu=True, replica_slots=2)
    env = worker_env(spec, worker_id="w0", slot="h:2,3", store="s:1")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    # Under torchrun's variables each such worker is a node of its own, as a Kubeflow pod
    # given several GPUs is: cuda:0 is its first GPU, never another worker's.
    world = TorchrunWorld(
        run_id="r", master_addr="h", master_port=1, restart_count=0, max_restarts=3, gpus=True
    )
    envs = dict(torchrun_env(["h:0,1", "h:2,3", "g:0,1"], world, {}))
    assert envs["h:2,3"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert (envs["h:2,3"]["LOCAL_RANK"], envs["h:2,3"]["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert [envs[s]["RANK"] for s in ("h:0,1", "h:2,3", "g:0,1")] == ["0", "1", "2"]
    assert envs["g:0,1"]["GROUP_RANK"] == "2" and envs["g:0,1"]["GROUP_WORLD_SIZE"] == "3"
