"""Per-role restart policies and the success rule of multi-role jobs."""

from __future__ import annotations

import pytest

from tidal.policy.role_restart import (
    ReplicaExit,
    RoleProgress,
    RoleRule,
    Verdict,
    exit_verdict,
    job_outcome,
    respawns,
    sort_exits,
)


@pytest.mark.parametrize(
    ("policy", "code", "ends_job", "expected"),
    [
        ("OnFailure", 1, True, Verdict.RESTART),
        ("OnFailure", 0, True, Verdict.DONE),
        ("Never", 3, True, Verdict.FAIL),
        ("Never", 3, False, Verdict.IGNORE),
        ("Never", 0, True, Verdict.DONE),
        ("Always", 0, True, Verdict.RESTART),
        ("Always", 2, False, Verdict.RESTART),
        ("ExitCode", 1, True, Verdict.FAIL),
        ("ExitCode", 127, True, Verdict.FAIL),
        ("ExitCode", 128, True, Verdict.RESTART),
        ("ExitCode", 137, True, Verdict.RESTART),
        ("ExitCode", -9, True, Verdict.RESTART),  # killed by SIGKILL, as Popen reports it
        ("ExitCode", None, True, Verdict.RESTART),  # unknown: a lost host
        ("ExitCode", 0, True, Verdict.DONE),
    ],
)
def test_exit_verdicts(policy: str, code: int | None, ends_job: bool, expected: Verdict) -> None:
    assert exit_verdict(policy, code, ends_job=ends_job) is expected


def test_an_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"restart\.policy"):
        exit_verdict("Sometimes", 1, ends_job=True)


def test_what_a_replica_set_starts_again() -> None:
    assert respawns("OnFailure", 1) and not respawns("OnFailure", 0)
    assert not respawns("Never", 1) and respawns("Always", 0)
    assert respawns("ExitCode", -9)


def test_sort_exits_fails_naming_the_role_and_replica() -> None:
    rules = {"ps": RoleRule("Never", ends_job=False), "worker": RoleRule("ExitCode")}
    fatal, retry = sort_exits(rules, [ReplicaExit("worker", 1, -9), ReplicaExit("worker", 2, 3)])
    assert fatal == "roles.worker[2] exited with status 3 (restart policy ExitCode)"
    assert retry == []
    fatal, retry = sort_exits(
        rules, [ReplicaExit("worker", 1, -9), ReplicaExit("ps", 0, 1), ReplicaExit("x", 0, 2)]
    )
    # A signal is retried; a ps that does not end the job stays down; unknown roles restart.
    assert (fatal, retry) == (None, [0, 2])


def test_the_job_succeeds_when_every_role_that_ends_it_did() -> None:
    running = {
        "ps": RoleProgress(ends_job=False),
        "worker": RoleProgress(ends_job=True, succeeded=False),
    }
    assert job_outcome(running) is None
    done = {**running, "worker": RoleProgress(ends_job=True, succeeded=True)}
    assert job_outcome(done) == "succeeded"
    broken = {**done, "ps": RoleProgress(ends_job=False, failed=True)}
    assert job_outcome(broken) == "failed"
    # No role marked: all must succeed.
    both = {"a": RoleProgress(False, succeeded=True), "b": RoleProgress(False)}
    assert job_outcome(both) is None
