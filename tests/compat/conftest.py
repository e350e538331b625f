"""The controller tests' in-process API server, for the manifest tests; the runtime
tests' ``tidal run`` launches, for the training entry points."""

from tests.controller.conftest import served
from tests.runtime.conftest import launches

__all__ = ["launches", "served"]
