"""The parameter-server job's configuration, its environment contract and the shard plan."""

from __future__ import annotations

import itertools

import pytest
import torch

from tidal.ps.config import ClusterSpec, PSConfig, publish_address
from tidal.ps.shard import plan_shards


def test_n_ps_zero_is_an_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^n_ps: .*at least 1.*got 0"):
        PSConfig(n_ps=0).validate()
    with pytest.raises(ValueError, match=r"^n_ps: "):
        ClusterSpec.from_env({"TIDAL_PS_ROLE": "ps", "TIDAL_PS_N_PS": "0"})


def test_replicas_to_aggregate_above_max_workers_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=r"^replicas_to_aggregate: 5 is larger than max_workers \(4\)"
    ):
        PSConfig(mode="sync", replicas_to_aggregate=5, max_workers=4).validate()
    PSConfig(mode="sync", replicas_to_aggregate=4, max_workers=4).validate()
    with pytest.raises(ValueError, match=r"^mode: "):
        PSConfig(mode="both").validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^max_staleness: "):
        PSConfig(mode="async", max_staleness=-1).validate()


def test_environment_contract_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = PSConfig(
        n_ps=2,
        mode="async",
        max_workers=4,
        max_staleness=3,
        checkpoint_dir=str(tmp_path),
        checkpoint_every=7,
        peer_timeout=2.5,
    )
    spec = ClusterSpec(
        role="worker", index=3, config=config, worker_id="w-a", address_dir=str(tmp_path / "addr")
    )
    back = ClusterSpec.from_env(spec.to_env())
    assert back == spec
    assert back.server_address(1) is None
    publish_address(str(tmp_path / "addr"), 1, "tcp://127.0.0.1:4242")
    assert back.server_address(1) == "tcp://127.0.0.1:4242"
    with pytest.raises(ValueError, match="TIDAL_PS_ROLE"):
        ClusterSpec.from_env({"TIDAL_PS_ROLE": "evaluator"})
    chief = ClusterSpec.from_env({**spec.to_env(), "TIDAL_PS_ROLE": "chief", "TIDAL_PS_INDEX": "0"})
    assert (chief.role, chief.index) == ("chief", 0)
    with pytest.raises(ValueError, match="TIDAL_PS_INDEX: a job has one chief"):
        ClusterSpec.from_env({**spec.to_env(), "TIDAL_PS_ROLE": "chief", "TIDAL_PS_INDEX": "1"})
    with pytest.raises(ValueError, match="TIDAL_PS_ADDRESSES: 1 endpoints for n_ps=2"):
        ClusterSpec.from_env(
            {
                "TIDAL_PS_ROLE": "worker",
                "TIDAL_PS_N_PS": "2",
                "TIDAL_PS_ADDRESSES": "tcp://127.0.0.1:1",
            }
        )
    with pytest.raises(ValueError, match="TIDAL_PS_MAX_WORKERS: expected a number"):
        ClusterSpec.from_env({"TIDAL_PS_ROLE": "ps", "TIDAL_PS_MAX_WORKERS": "many"})


def test_shards_balance_bytes_not_tensors() -> None:
    # the 6.3M-parameter MLP of the benchmarks: one matrix is 90% of it
    shapes = [(2380, 256), (2380,), (2380, 2380), (2380,), (10, 2380), (10,)]
    params = [(f"p{i}", torch.Size(s), torch.float32) for i, s in enumerate(shapes)]
    total = sum(torch.Size(s).numel() for s in shapes) * 4
    for n in (1, 2, 3, 4):
        layout = plan_shards(params, n)
        sizes = [layout.nbytes(i) for i in range(n)]
        assert sum(sizes) == total
        assert max(sizes) - min(sizes) <= 2 * 4  # equal to within an element or two
        covered: dict[int, list[tuple[int, int]]] = {}
        for shard in layout.shards:
            for piece in shard:
                covered.setdefault(piece.param, []).append((piece.start, piece.stop))
        for i, s in enumerate(shapes):  # every element exactly once, in order
            ranges = sorted(covered[i])
            assert ranges[0][0] == 0 and ranges[-1][1] == torch.Size(s).numel()
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert plan_shards(params, 2).digest != plan_shards(params, 3).digest
    with pytest.raises(ValueError, match="n_ps"):
        plan_shards(params, 0)


def test_mixed_dtypes_balance_bytes() -> None:
    params = [("a", torch.Size([1000]), torch.float64), ("b", torch.Size([1000]), torch.float16)]
    layout = plan_shards(params, 2)
    assert layout.nbytes(0) == layout.nbytes(1) == 5000
    assert [p.param for p in layout.shards[0]] == [0]  # 625 float64 = 5000 bytes
