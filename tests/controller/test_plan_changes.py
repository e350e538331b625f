"""Which jobs' slots change this round, and which wait for slots to be released."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tidal.controller.loop.allocation import Placed, plan_changes
from tidal.controller.store.jobs import JobStore
from tidal.controller.store.records import JobRecord
from tidal.policy.api import Slot
from tidal.spec import parse_spec


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    s = JobStore.open(tmp_path)
    yield s
    s.close()


def _job(store: JobStore, name: str, *slots: int) -> JobRecord:
    record = store.add_job(parse_spec({"name": name, "command": "true", "workers": "1:4"}))
    return replace(record, slots=tuple(("h", i) for i in slots))


def _occupied(*jobs: JobRecord) -> dict[Slot, str]:
    return {slot: job.id for job in jobs for slot in job.slots}


def _by_name(changes: list[Placed]) -> dict[str, Placed]:
    return {c.job.name: c for c in changes}


def test_a_job_getting_a_slot_still_held_waits_while_the_holder_releases(store: JobStore) -> None:
    a, b = _job(store, "a", 0, 1), _job(store, "b", 2, 3)
    changes = _by_name(
        plan_changes(
            [a, b], {a.id: [("h", 0)], b.id: [("h", 1), ("h", 2), ("h", 3)]}, _occupied(a, b)
        )
    )
    # The release goes first and now; the grow waits for the slot's worker to leave.
    assert changes["a"].slots == (("h", 0),) and not changes["a"].busy
    assert changes["b"].busy == (("h", 1),)


def test_jobs_waiting_on_each_other_release_what_the_other_waits_for(store: JobStore) -> None:
    # a moves from {0, 1} to {2}; b from {2, 3} to {0, 1, 3}: each would wait for good.
    a, b = _job(store, "a", 0, 1), _job(store, "b", 2, 3)
    proposed = {a.id: [("h", 2)], b.id: [("h", 0), ("h", 1), ("h", 3)]}
    changes = _by_name(plan_changes([a, b], proposed, _occupied(a, b)))
    # a cannot give up both of its slots (it would have none); b can give up slot 2.
    assert changes["a"].busy == (("h", 2),)
    assert changes["b"].slots == (("h", 3),) and not changes["b"].busy
    # Next round b holds {3}: a takes slot 2 and leaves 0 and 1, then b grows into them.
    b = replace(b, slots=(("h", 3),))
    changes = _by_name(plan_changes([a, b], proposed, _occupied(a, b)))
    assert changes["a"].slots == (("h", 2),) and not changes["a"].busy
    a = replace(a, slots=(("h", 2),))
    changes = _by_name(plan_changes([a, b], proposed, _occupied(a, b)))
    assert set(changes) == {"b"} and not changes["b"].busy


def test_a_release_never_takes_a_job_below_its_least(store: JobStore) -> None:
    a, b = _job(store, "a", 0, 1), _job(store, "b", 2, 3)
    proposed = {a.id: [("h", 2), ("h", 3)], b.id: [("h", 0), ("h", 1)]}
    changes = _by_name(plan_changes([a, b], proposed, _occupied(a, b), {a.id: 2, b.id: 2}))
    assert changes["a"].busy and changes["b"].busy


def test_a_job_waiting_on_a_holder_that_moves_now_just_waits(store: JobStore) -> None:
    a, b, c = _job(store, "a", 0), _job(store, "b", 1, 2), _job(store, "c", 3)
    # b shrinks now (no wait); a waits for b's slot 2 and is not made to release anything.
    proposed = {a.id: [("h", 0), ("h", 2)], b.id: [("h", 1)], c.id: [("h", 3)]}
    changes = _by_name(plan_changes([a, b, c], proposed, _occupied(a, b, c)))
    assert changes["b"].slots == (("h", 1),)
    assert changes["a"].slots == (("h", 0), ("h", 2)) and changes["a"].busy == (("h", 2),)
