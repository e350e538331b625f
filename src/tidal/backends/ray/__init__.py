"""Run workers on an existing Ray cluster (``tidal server --backend ray``); needs the
``ray`` extra: ``pip install 'tidal[ray]'``."""

from tidal.backends.ray.backend import SLOT_RESOURCE, RayBackend

__all__ = ["SLOT_RESOURCE", "RayBackend"]
