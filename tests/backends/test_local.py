"""The local backend (per-job agents and their worker subprocesses) passes the backend
conformance suite, re-attaching to its agents included."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.backends.conformance import BackendConformance, Harness
from tidal.backends.local import LocalBackend

pytestmark = pytest.mark.slow


class TestLocalConformance(BackendConformance):
    """Every case of the suite, on this machine's slots."""

    @pytest.fixture
    def harness(self) -> Iterator[Harness]:
        """Local backends, closed (jobs stopped, agents ended) after the test."""
        made = Harness(
            make=lambda data: LocalBackend(data),
            slots=(("local", 0), ("local", 1), ("local", 2)),
        )
        yield made
        made.close()
