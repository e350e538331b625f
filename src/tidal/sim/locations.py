"""Where the simulator finds its data by default."""

from __future__ import annotations

from pathlib import Path

#: Repository root (``src/tidal/sim/`` is three levels below it).
REPO_ROOT = Path(__file__).resolve().parents[3]

#: The traces live beside the repository, in ``shared/traces``.
DEFAULT_TRACES = REPO_ROOT.parent / "shared" / "traces"
DEFAULT_PROFILES = DEFAULT_TRACES / "pollux" / "profiles"
DEFAULT_WORKLOADS = DEFAULT_TRACES / "pollux" / "workloads-0.5"
DEFAULT_PHILLY = DEFAULT_TRACES / "philly.csv"
