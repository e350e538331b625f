"""The chief's decision that training is over, from the servers' view of the workers."""

from __future__ import annotations

import pytest

from tidal.ps.chief import WorkerStates, merge_statuses, training_over


def test_a_worker_active_on_any_server_is_active() -> None:
    view = merge_statuses(
        [
            {"workers": {"a": "finished", "b": "lost"}, "lost_for": {"b": 9.0}},
            {"workers": {"a": "finished", "b": "active"}, "lost_for": {}},
        ]
    )
    assert view == WorkerStates({"a": "finished", "b": "active"}, {})
    lost = merge_statuses(
        [
            {"workers": {"b": "lost"}, "lost_for": {"b": 9.0}},
            {"workers": {"b": "lost"}, "lost_for": {"b": 2.0}},
        ]
    )
    assert lost.lost_for == {"b": 2.0}  # the server that heard it last


@pytest.mark.parametrize(
    ("states", "lost_for", "grace", "over"),
    [
        ({}, {}, None, False),  # nobody joined yet
        ({"a": "finished", "b": "finished"}, {}, None, True),
        ({"a": "finished", "b": "active"}, {}, None, False),
        # a silent worker may be restarted: not over, unless gone for longer than the grace
        ({"a": "finished", "b": "lost"}, {"b": 60.0}, None, False),
        ({"a": "finished", "b": "lost"}, {"b": 5.0}, 30.0, False),
        ({"a": "finished", "b": "lost"}, {"b": 60.0}, 30.0, True),
        ({"a": "lost"}, {"a": 60.0}, 30.0, False),  # nobody finished: a failed job
    ],
)
def test_training_is_over_once_every_worker_finished(
    states: dict[str, str], lost_for: dict[str, float], grace: float | None, over: bool
) -> None:
    assert training_over(WorkerStates(states, lost_for), grace) is over
