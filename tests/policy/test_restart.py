"""The restart decision: finished and released workers are no failures, losses count per
host, the budget is spent after ``max_restarts`` failures."""

from __future__ import annotations

from tidal.policy.restart import (
    CRASH_LOOP_CAP,
    Fail,
    LostWorker,
    Noop,
    Restart,
    RestartView,
    crash_loop_delay,
    decide_restart,
)


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


def test_a_failure_before_joining_claims_no_checkpoint() -> None:
    view = RestartView(max_restarts=3, restarts=0, group_gone=True, before_join=True)
    decision = decide_restart(view, [lost("0", 1)])
    assert isinstance(decision, Restart) and decision.delay == 0
    assert decision.reason == "worker 0 failed before joining; starting it again (restart 1/3)"
    assert not decision.from_checkpoint


def test_the_same_error_before_joining_backs_off_exponentially_and_capped() -> None:
    error = "FileNotFoundError: [Errno 2] No such file or directory: 'train.csv'"
    delays = []
    for count in range(1, 9):
        view = RestartView(
            max_restarts=100, restarts=count - 1, before_join=True, cause=error, loop_count=count
        )
        decision = decide_restart(view, [lost("0", 1)])
        assert isinstance(decision, Restart)
        delays.append(decision.delay)
        if count > 1:
            assert decision.reason.startswith(f"crash loop: worker 0 failed {count} times")
            assert error in decision.reason and "checkpoint" not in decision.reason
    assert delays == [0, 10, 20, 40, 80, 160, 300, 300]
    assert crash_loop_delay(10**6) == CRASH_LOOP_CAP
    # After joining, a failure is no crash loop whatever its count.
    joined = RestartView(max_restarts=9, restarts=0, cause=error, loop_count=5)
    decision = decide_restart(joined, [lost("0", 1)])
    assert isinstance(decision, Restart) and decision.delay == 0


def test_a_torchrun_script_under_another_launcher_fails_at_once() -> None:
    cause = (
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable RANK expected, but not set"
    )
    view = RestartView(max_restarts=3, restarts=0, before_join=True, cause=cause)
    decision = decide_restart(view, [lost("0", 1)])
    assert isinstance(decision, Fail) and decision.restarts == 0
    assert "--launcher torchrun" in decision.reason
    # Under torchrun itself the variables are set: such an error is an ordinary failure.
    torchrun = RestartView(max_restarts=3, restarts=0, before_join=True, cause=cause, torchrun=True)
    assert isinstance(decide_restart(torchrun, [lost("0", 1)]), Restart)
