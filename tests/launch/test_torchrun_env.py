"""The environment a torchrun-launched worker gets (:func:`torchrun_env`)."""

from __future__ import annotations

import pytest

from tidal.launch.groups.torchrun_env import TorchrunWorld, torchrun_env

WORLD = TorchrunWorld(
    run_id="job-7", master_addr="10.0.0.5", master_port=29512, restart_count=2, max_restarts=3
)


def test_one_host_gets_what_torchrun_nproc_per_node_gives() -> None:
    envs = torchrun_env(["a:0", "a:1", "a:2"], WORLD, {})
    assert [slot for slot, _ in envs] == ["a:0", "a:1", "a:2"]
    for rank, (_, env) in enumerate(envs):
        assert env == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "3",
            "ROLE_NAME": "default",
            "MASTER_ADDR": "10.0.0.5",
            "MASTER_PORT": "29512",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": "job-7",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            # torchrun's default when a node runs more than one worker.
            "OMP_NUM_THREADS": "1",
        }


def test_hosts_are_nodes_and_their_ranks_are_contiguous() -> None:
    envs = torchrun_env(["a:0", "b:3", "a:1", "b:0", "c:2"], WORLD, {})
    rows = [
        (slot, e["RANK"], e["GROUP_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"])
        for slot, e in envs
    ]
    assert rows == [
        ("a:0", "0", "0", "0", "2"),
        ("a:1", "1", "0", "1", "2"),
        ("b:3", "2", "1", "0", "2"),
        ("b:0", "3", "1", "1", "2"),
        ("c:2", "4", "2", "0", "1"),
    ]
    assert {e["GROUP_WORLD_SIZE"] for _, e in envs} == {"3"}
    assert {e["WORLD_SIZE"] for _, e in envs} == {"5"}
    # A host alone on its node gets no thread cap, as under torchrun with one process.
    assert "OMP_NUM_THREADS" not in envs[-1][1]


def test_gpu_slots_make_cuda_local_rank_the_slots_own_gpu() -> None:
    world = TorchrunWorld("r", "h", 1, 0, 0, gpus=True)
    envs = dict(torchrun_env(["n1:5", "n1:2", "n2:7"], world, {}))
    assert envs["n1:5"]["CUDA_VISIBLE_DEVICES"] == "5,2"
    assert envs["n1:5"]["LOCAL_RANK"] == "0"
    assert envs["n1:2"]["CUDA_VISIBLE_DEVICES"] == "5,2"
    assert envs["n1:2"]["LOCAL_RANK"] == "1"  # cuda:1 is GPU 2: its own slot
    assert envs["n2:7"]["CUDA_VISIBLE_DEVICES"] == "7"
    assert "CUDA_VISIBLE_DEVICES" not in dict(torchrun_env(["n1:5"], WORLD, {}))["n1:5"]


def test_what_the_job_sets_is_kept() -> None:
    inherited = {"OMP_NUM_THREADS": "4", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    _, env = torchrun_env(["a:0", "a:1"], WORLD, inherited)[0]
    assert "OMP_NUM_THREADS" not in env  # the inherited value stays in force
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_a_slot_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="slots: each slot at most once"):
        torchrun_env(["a:0", "a:0"], WORLD, {})
