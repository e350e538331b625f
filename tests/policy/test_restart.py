"""The restart decision: finished and released workers are no failures, losses count per
host, the budget is spent after ``max_restarts`` failures."""

from __future__ import annotations

from tidal.policy.restart import Fail, LostWorker, Noop, Restart, RestartView, decide_restart


def lost(worker: str, code: int | None = -9, host: str = "h1", **kw: bool) -> LostWorker:
    return LostWorker(worker, host, code, **kw)


def test_finished_and_released_workers_are_no_failure() -> None:
    view = RestartView(max_restarts=0, restarts=0)
    decision = decide_restart(view, [lost("1", 0), lost("2", 75, released=True)])
    assert isinstance(decision, Noop)
    assert decide_restart(view, []) == Noop("no worker failed")
    # A released worker fails nothing whatever its status (it was killed by its group).
    assert isinstance(decide_restart(view, [lost("3", -9, released=True)]), Noop)


def test_failure_within_budget_restarts_and_counts_one() -> None:
    decision = decide_restart(RestartView(max_restarts=2, restarts=1), [lost("4", 1)])
    assert decision == Restart(
        restarts=2,
        workers=("4",),
        exit_codes=(1,),
        reason="replacing failed worker 4 (restart 2/2)",
    )


def test_past_the_budget_fails_with_the_reason() -> None:
    decision = decide_restart(RestartView(max_restarts=1, restarts=1), [lost("7", 3)])
    assert isinstance(decision, Fail)
    assert decision.restarts == 2
    assert decision.reason == "worker 7 failed (exit [3]); restart limit 1 reached"
    assert isinstance(decide_restart(RestartView(0, 0), [lost("0", 1)]), Fail)


def test_losses_count_once_per_host() -> None:
    node = [lost(str(i), -9, host="n2") for i in range(4)]
    decision = decide_restart(RestartView(max_restarts=1, restarts=0), node)
    assert isinstance(decision, Restart)
    assert decision.restarts == 1, "a lost node is one failure, not one per worker"
    assert decision.workers == ("0", "1", "2", "3")
    two_hosts = [lost("0", host="n1"), lost("1", host="n2"), lost("2", 0, host="n3")]
    decision = decide_restart(RestartView(max_restarts=1, restarts=0), two_hosts)
    assert isinstance(decision, Fail) and decision.restarts == 2
    assert decision.workers == ("0", "1"), "the finished worker is not listed as failed"


def test_no_survivor_restarts_from_the_checkpoint_or_the_start() -> None:
    gone = RestartView(max_restarts=3, restarts=0, group_gone=True)
    decision = decide_restart(gone, [lost("0"), lost("1")])
    assert isinstance(decision, Restart) and decision.from_checkpoint
    assert "restarting from the latest checkpoint" in decision.reason
    fresh = RestartView(max_restarts=3, restarts=0, group_gone=True, checkpoint=False)
    decision = decide_restart(fresh, [lost("0")])
    assert isinstance(decision, Restart)
    assert "from the start (no checkpoint yet)" in decision.reason
