"""Parameter-server jobs of real processes training on digits (seconds each: slow)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sklearn.datasets
import sklearn.model_selection
import sklearn.preprocessing  # noqa: F401
import torch
import torch.distributed as dist
from torch import nn

from tidal.ps import LocalCluster, ParameterServerError, ParameterServerModel, PSConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "ps_digits.py")
EQUAL_STEPS = str(Path(__file__).with_name("equal_steps_job.py"))
THRESHOLD = 0.9
pytestmark = pytest.mark.slow
torch.set_num_threads(1)


def wait_for(
    what: str, predicate: Callable[[], bool], cluster: LocalCluster, timeout: float
) -> None:
    """Wait for ``predicate``; on timeout fail with every process's log."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {p.log.name}\n{p.output()[-2000:]}"
                for p in [*cluster.servers.values(), *cluster.workers.values()]
            )
            pytest.fail(f"waited {timeout:.0f}s for {what}\n{logs}")
        time.sleep(0.05)


def trace(out: Path, worker: str) -> list[dict[str, Any]]:
    path = out / f"{worker}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def result(out: Path, worker: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out / f"{worker}.json").read_text())
    return loaded


def run_job(
    tmp_path: Path, config: PSConfig, workers: int, *args: str, timeout: float = 60
) -> Path:
    out = tmp_path / "out"
    with LocalCluster(EXAMPLE, config, tmp_path, args=["--out", str(out), *args]) as cluster:
        cluster.start_servers()
        for i in range(workers):
            cluster.start_worker(i)
        wait_for(
            "the workers to finish",
            lambda: all(p.poll() is not None for p in cluster.workers.values()),
            cluster,
            timeout,
        )
        assert all(p.poll() == 0 for p in cluster.workers.values()), [
            p.output() for p in cluster.workers.values()
        ]
    return out


def test_sync_digits_with_two_servers_reach_the_threshold(tmp_path: Path) -> None:
    config = PSConfig(n_ps=2, mode="sync", max_workers=2, peer_timeout=3.0)
    out = run_job(tmp_path, config, 2, "--epochs", "3")
    for w in ("worker-0", "worker-1"):
        r = result(out, w)
        assert r["accuracy"] >= THRESHOLD, r
        assert r["stats"]["dropped"] == 0  # replicas = all workers: no gradient is dropped


def test_async_digits_with_a_staleness_bound_reach_the_threshold(tmp_path: Path) -> None:
    config = PSConfig(n_ps=1, mode="async", max_workers=2, max_staleness=2, peer_timeout=3.0)
    out = run_job(tmp_path, config, 2, "--epochs", "3")
    for w in ("worker-0", "worker-1"):
        r = result(out, w)
        assert r["accuracy"] >= THRESHOLD, r
        assert r["stats"]["pulls"] < r["stats"]["pushes"]  # stale-tolerant: fewer pulls


def test_async_workers_join_and_are_killed_mid_training(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = PSConfig(n_ps=2, mode="async", max_workers=3, peer_timeout=2.0)
    args = ["--out", str(out), "--epochs", "4", "--step-delay", "0.01"]
    with LocalCluster(EXAMPLE, config, tmp_path, args=args) as cluster:
        cluster.start_servers()
        cluster.start_worker(0)
        first = cluster.start_worker(1)
        wait_for("worker-1 to train", lambda: len(trace(out, "worker-1")) >= 25, cluster, 60)
        first.signal(signal.SIGKILL)  # mid-training, possibly mid-push
        assert first.wait(10) is not None
        cluster.start_worker(2)  # a new worker joins while the others run
        wait_for("worker-2 to train", lambda: len(trace(out, "worker-2")) >= 10, cluster, 60)
        before = trace(out, "worker-1")
        cluster.start_worker(1)  # worker-1 rejoins under its id
        wait_for(
            "every worker to finish",
            lambda: all(p.poll() is not None for p in cluster.workers.values()),
            cluster,
            90,
        )
        codes = {n: p.poll() for n, p in cluster.workers.items()}
    assert codes == {
        "worker-0-0": 0,
        "worker-1-0": -signal.SIGKILL,
        "worker-2-0": 0,
        "worker-1-1": 0,
    }
    for w in ("worker-0", "worker-1", "worker-2"):
        assert result(out, w)["accuracy"] >= THRESHOLD, result(out, w)
    # the rejoined worker resumed where its last gradient left off: no batch seen twice
    last = (before[-1]["epoch"], before[-1]["batch"])
    start = result(out, "worker-1")["start"]
    assert (start["epoch"], start["batch"]) >= last
    batches = [(d["epoch"], d["batch"]) for d in trace(out, "worker-1")]
    assert len(batches) == len(set(batches))
    # 4 epochs of its stream (479 samples, 30 batches of 16), less at most the one batch
    # whose gradient was in flight when it was killed
    assert len(batches) in (4 * 30 - 1, 4 * 30)


def _ddp_reference(rank: int, world: int, steps: int, size: int, store: str, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    from examples.ps_digits import build_model

    from tests.ps.equal_steps_job import LR, MOMENTUM, batch

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(build_model(32))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for t in range(steps):
        x, y = batch(t, rank, world, size)
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), Path(out) / "ddp.pt")
    # Leave together, and drop DDP (whose reducer holds the group) before the group: a rank
    # tearing down while a peer still talks to it, or a reducer outliving its group until
    # interpreter exit, can abort the process ("terminate called without an active
    # exception") after its work is done.
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()


def test_sync_with_2_servers_and_3_workers_matches_allreduce(tmp_path: Path) -> None:
    steps, size, world = 6, 16, 3
    out = tmp_path / "out"
    out.mkdir()
    # The reference runs in fresh interpreters: a child forked from this process (which
    # ran every earlier test's threads) could inherit a lock held at the fork and hang.
    spawn = multiprocessing.get_context("spawn")
    store = str(tmp_path / "store")
    references = [
        spawn.Process(target=_ddp_reference, args=(r, world, steps, size, store, str(out)))
        for r in range(world)
    ]
    for reference in references:
        reference.start()
    config = PSConfig(n_ps=2, mode="sync", replicas_to_aggregate=3, max_workers=3)
    args = ["--out", str(out), "--steps", str(steps), "--batch-size", str(size)]
    try:
        with LocalCluster(EQUAL_STEPS, config, tmp_path / "ps", args=args) as cluster:
            cluster.start_servers()
            for i in range(world):
                cluster.start_worker(i)
            wait_for(
                "the workers",
                lambda: all(p.poll() is not None for p in cluster.workers.values()),
                cluster,
                60,
            )
            assert [p.poll() for p in cluster.workers.values()] == [0, 0, 0], cluster.workers[
                "worker-0-0"
            ].output()
    finally:
        deadline = time.monotonic() + 120
        for reference in references:
            reference.join(max(0.0, deadline - time.monotonic()))
            if reference.is_alive():
                reference.kill()
                reference.join(10)
    assert [r.exitcode for r in references] == [0, 0, 0]
    ps, ddp = torch.load(out / "ps.pt"), torch.load(out / "ddp.pt")
    sys.path.insert(0, str(ROOT))
    from examples.ps_digits import build_model

    start = build_model(32).state_dict()
    for name in ddp:
        assert not torch.allclose(start[name], ddp[name])  # training moved them
        torch.testing.assert_close(ps[name], ddp[name], rtol=1e-5, atol=1e-6)


def test_a_killed_server_is_restored_from_its_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = PSConfig(
        n_ps=2,
        mode="sync",
        max_workers=2,
        checkpoint_dir=str(tmp_path / "ckpt"),
        checkpoint_every=10,
        peer_timeout=2.0,
    )
    args = ["--out", str(out), "--epochs", "3", "--step-delay", "0.01"]
    with LocalCluster(EXAMPLE, config, tmp_path, args=args) as cluster:
        cluster.start_servers()
        for i in range(2):
            cluster.start_worker(i)
        wait_for("35 steps", lambda: len(trace(out, "worker-0")) >= 35, cluster, 60)
        cluster.servers[1].signal(signal.SIGKILL)
        assert cluster.servers[1].wait(10) is not None
        # Read once the server is dead, not when the signal was sent: until it dies it
        # applies pushes whose lines the workers write after (a restore at 40 was seen
        # "after" a kill read at 38 on a loaded machine).
        killed_at = len(trace(out, "worker-0"))
        restarted = cluster.start_server(1)
        wait_for(
            "the workers to finish",
            lambda: all(p.poll() is not None for p in cluster.workers.values()),
            cluster,
            90,
        )
        assert [p.poll() for p in cluster.workers.values()] == [0, 0]
        log = restarted.output()
    assert "restored its shard at version" in log
    restored = int(log.split("restored its shard at version ")[1].split()[0])
    assert restored % 10 == 0 and restored >= 30
    lost = killed_at - restored
    print(f"server 1 killed at step ~{killed_at}, restored at version {restored}: lost {lost}")
    assert 0 <= lost <= 10 + 5  # at most checkpoint_every, plus the steps while it died
    for w in ("worker-0", "worker-1"):
        r = result(out, w)
        assert r["accuracy"] >= THRESHOLD and r["stats"]["recoveries"] >= 1, r


def test_a_failing_optimizer_factory_reaches_the_worker_with_its_traceback(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = PSConfig(n_ps=1, mode="sync", max_workers=1, peer_timeout=2.0)
    with LocalCluster(
        EXAMPLE, config, tmp_path, args=["--out", str(out), "--optimizer", "bad"]
    ) as cluster:
        cluster.start_servers()
        worker = cluster.start_worker(0)
        wait_for("the worker to fail", lambda: worker.poll() is not None, cluster, 60)
        assert worker.poll() == 1
        cluster.stop()
        server = cluster.servers[0]
        assert server.poll() == 1
    for text in (worker.output(), server.output()):
        assert "optimizer factory failed on parameter server 0" in text
        assert "Invalid learning rate: -1.0" in text
        assert "Traceback" in text


def test_a_server_that_never_returns_is_an_error_within_seconds(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = PSConfig(n_ps=1, mode="async", max_workers=1, peer_timeout=1.0, recover_timeout=3.0)
    args = ["--out", str(out), "--epochs", "50", "--step-delay", "0.01"]
    with LocalCluster(EXAMPLE, config, tmp_path, args=args) as cluster:
        cluster.start_servers()
        worker = cluster.start_worker(0)
        wait_for("5 steps", lambda: len(trace(out, "worker-0")) >= 5, cluster, 60)
        cluster.servers[0].signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for("the worker to fail", lambda: worker.poll() is not None, cluster, 30)
        waited = time.monotonic() - killed
    assert worker.poll() == 1
    assert "did not return within recover_timeout=3.0s" in worker.output()
    # found lost within the peer timeout, then the bounded wait for a restart
    assert waited < 1.0 + 3.0 + 5.0, waited


def test_a_chief_evaluates_waits_for_the_workers_and_saves_the_final_model(
    tmp_path: Path,
) -> None:
    from examples.ps_digits import accuracy, build_data, build_model

    out = tmp_path / "out"
    config = PSConfig(n_ps=1, mode="sync", max_workers=2, peer_timeout=3.0)
    args = ["--out", str(out), "--epochs", "3", "--eval-every", "0.5", "--timeout", "120"]
    with LocalCluster(EXAMPLE, config, tmp_path, args=args) as cluster:
        cluster.start_servers()
        chief = cluster.start_chief()  # before the workers: it waits for them to join
        for i in range(2):
            cluster.start_worker(i)
        wait_for("the chief to finish", lambda: chief.poll() is not None, cluster, 120)
        assert chief.poll() == 0, chief.output()
        wait_for(
            "the workers to exit",
            lambda: all(p.poll() is not None for p in cluster.workers.values()),
            cluster,
            30,
        )
        assert all(p.poll() == 0 for p in cluster.workers.values())
        # an observer beside the live servers: it reads, refuses to push, sees the end
        observer = ParameterServerModel(
            build_model(64), lambda p: torch.optim.SGD(p, lr=0.1), spec=cluster.spec("chief", 0)
        )
        with observer:
            states = observer.worker_states().states
            assert states == {"worker-0": "finished", "worker-1": "finished"}
            assert observer.training_done()
            _, test_set = build_data(0)
            assert accuracy(observer, test_set) >= THRESHOLD  # forward pulled
            final_version = observer.version
            with pytest.raises(ParameterServerError, match="does not push"):
                observer.push()
        servers = list(cluster.servers.values())
    assert all(p.poll() is not None for p in cluster.processes())
    for p in servers:
        with pytest.raises(ProcessLookupError):
            os.kill(p.pid, 0)
    chief_result = result(out, "chief")
    versions = [e["version"] for e in chief_result["evaluations"]]
    assert versions == sorted(versions) and len(versions) >= 2, versions
    saved = torch.load(out / "chief-final.pt", weights_only=True)
    # sync, 2 workers, 3 epochs of ~45 batches each: at least 135 / 2 steps
    # the chief saved after the last update: it waited for both workers to finish
    assert saved["version"] == chief_result["version"] == versions[-1] == final_version >= 68
    fresh = build_model(64, seed=1)
    fresh.load_state_dict(saved["model"])
    _, test_set = build_data(0)
    assert accuracy(fresh, test_set) >= THRESHOLD
    pushes = [result(out, w)["stats"]["applied"] for w in ("worker-0", "worker-1")]
    assert pushes == [135, 135]  # every gradient of both workers applied; none by the chief


def test_a_worker_stopped_with_sigterm_leaves_and_the_chief_sees_it_finished(
    tmp_path: Path,
) -> None:
    """A shrink stops a worker with SIGTERM: it leaves cleanly (exit 143 through the
    script's ``with model:``), the servers count it finished at once, and the chief's
    ``checkpoints()`` ends without a ``lost_grace`` once the other worker is done."""
    out = tmp_path / "out"
    config = PSConfig(n_ps=1, mode="sync", max_workers=2, peer_timeout=30.0)
    args = ["--out", str(out), "--epochs", "3", "--step-delay", "0.01"]
    args += ["--eval-every", "0.5", "--timeout", "150"]
    with LocalCluster(EXAMPLE, config, tmp_path, args=args) as cluster:
        cluster.start_servers()
        chief = cluster.start_chief()
        cluster.start_worker(0)
        stopped = cluster.start_worker(1)
        wait_for("worker-1 to train", lambda: len(trace(out, "worker-1")) >= 20, cluster, 90)
        stopped.signal(signal.SIGTERM)
        # Left within a few steps: with peer_timeout 30 s, a silent exit would not be
        # counted before the chief's timeout made this test fail.
        assert stopped.wait(30) == 128 + signal.SIGTERM, stopped.output()
        wait_for("the chief to finish", lambda: chief.poll() is not None, cluster, 150)
        assert chief.poll() == 0, chief.output()
        assert cluster.workers["worker-0-0"].wait(30) == 0
    assert result(out, "worker-0")["accuracy"] >= THRESHOLD
    assert result(out, "chief")["accuracy"] >= THRESHOLD
