"""Fixtures shared by the runtime's multi-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.runtime.launcher import Launch


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """The ``tidal run`` launches a test started, each closed (its processes stopped)
    after the test."""
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.close()
