"""The dashboard's tests reuse the controller's API server over a fake backend."""

from __future__ import annotations

from tests.controller.conftest import Served, served

__all__ = ["Served", "served"]
