"""The ``tidal`` command: every verb (:mod:`tidal.cli.main` puts them on one app).

Light to start: ``tidal --help`` and ``tidal VERB --help`` import neither torch nor the
server (FastAPI, SQLAlchemy) nor the simulator; each verb imports what it runs.
"""

from __future__ import annotations

from tidal.cli.main import app, main

__all__ = ["app", "main"]
