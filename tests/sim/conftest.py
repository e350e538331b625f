"""Fixtures: the traces beside the repository (tests skip when they are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.sim.profiles import ModelProfile, load_profiles

#: Beside the repository, or wherever ``TIDAL_TRACES`` says (a worktree elsewhere).
TRACES = Path(
    os.environ.get("TIDAL_TRACES")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)


@pytest.fixture(scope="session")
def traces() -> Path:
    """The traces folder, or skip."""
    if not TRACES.is_dir():
        pytest.skip(f"traces not found at {TRACES}")
    return TRACES


@pytest.fixture(scope="session")
def profiles(traces: Path) -> dict[str, ModelProfile]:
    """All model profiles, loaded once."""
    return load_profiles(traces / "pollux" / "profiles")
