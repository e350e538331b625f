"""What the server and its clients share: the REST API's bodies (:mod:`tidal.wire.schema`)
and where a client finds a running server and its token (:mod:`tidal.wire.discovery`).

Light on purpose (pydantic, no server stack): the SDK and the ``tidal`` command import it.
"""
