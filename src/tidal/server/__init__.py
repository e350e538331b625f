"""The server's process: the controller's REST API and the dashboard composed into one web
app (:mod:`tidal.server.app`), served by uvicorn beside the controller's loop
(:mod:`tidal.server.process`, run by ``tidal server``).

It sits above the controller and the dashboard, so neither imports the other's host.
"""
