"""The loop's backoff after failed ticks: a pure decision of the wait and what to log."""

from __future__ import annotations

from tidal.controller.loop.backoff import MAX_BACKOFF_S, Failing, Report, after_tick


def _run(causes: list[str | None], interval: float = 0.5) -> list[tuple[float | None, Report]]:
    failing: Failing | None = None
    seen = []
    for n, cause in enumerate(causes):
        outcome = after_tick(failing, cause, float(n), interval)
        failing = outcome.failing
        seen.append((outcome.wait, outcome.report))
    return seen


def test_a_success_changes_nothing() -> None:
    assert _run([None, None]) == [(None, Report.NOTHING)] * 2


def test_failures_double_the_wait_up_to_the_cap_and_are_reported_once() -> None:
    seen = _run(["full"] * 8)
    assert [w for w, _ in seen] == [0.5, 1.0, 2.0, 4.0, MAX_BACKOFF_S, 5.0, 5.0, 5.0]
    assert [r for _, r in seen] == [Report.STARTED] + [Report.NOTHING] * 7


def test_recovery_is_reported_once_and_resets_the_wait() -> None:
    seen = _run(["full", "full", "full", None, None, "full"])
    assert seen[3] == (None, Report.RECOVERED)
    assert seen[4] == (None, Report.NOTHING)
    assert seen[5] == (0.5, Report.STARTED)


def test_a_new_cause_is_reported_again_without_resetting_the_wait() -> None:
    seen = _run(["full", "full", "down", "down"])
    assert [r for _, r in seen] == [Report.STARTED, Report.NOTHING, Report.CHANGED, Report.NOTHING]
    assert [w for w, _ in seen] == [0.5, 1.0, 2.0, 4.0]


def test_the_failing_state_counts_and_keeps_when_it_began() -> None:
    failing = None
    for n in range(3):
        failing = after_tick(failing, "full", 10.0 + n, 0.5).failing
    assert failing == Failing(count=3, since=10.0, cause="full")


def test_an_interval_longer_than_the_cap_is_the_wait() -> None:
    assert [w for w, _ in _run(["full"] * 3, interval=30.0)] == [30.0, 30.0, 30.0]


def test_the_wait_stays_bounded_after_very_many_failures() -> None:
    failing = Failing(count=10_000, since=0.0, cause="full")
    assert after_tick(failing, "full", 1.0, 0.5).wait == MAX_BACKOFF_S
