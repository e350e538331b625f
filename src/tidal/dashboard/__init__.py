"""The web dashboard: static pages served by the API on its own port, behind its token.

The pages are plain HTML and JavaScript modules under ``static/`` (no build step); they
read and change everything through the REST API. See ``docs/dashboard.md``.
"""

from __future__ import annotations

from tidal.dashboard.web import STATIC_DIR, mount_dashboard

__all__ = ["STATIC_DIR", "mount_dashboard"]
