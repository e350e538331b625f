"""The controller tests' in-process API server, for the manifest tests."""

from tests.controller.conftest import served

__all__ = ["served"]
