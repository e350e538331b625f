"""Ray's fake multi-node provider (its nodes are processes on this machine, started and
stopped by the real autoscaler), with node ids that differ from their first character.

Ray's own numbers its nodes ``ffff…f00001``, ``ffff…f00002``: every node id would then
start with the same 8 characters, which is how tidal names hosts. Real node ids are
random; so are these. Loaded by the autoscaler's process as an ``external`` provider.
"""

from __future__ import annotations

import secrets

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


class DistinctIdProvider(FakeMultiNodeProvider):  # type: ignore[misc]
    """The fake provider, its node ids random (28 bytes, as Ray's are)."""

    def _next_hex_node_id(self) -> str:
        return secrets.token_hex(28)
