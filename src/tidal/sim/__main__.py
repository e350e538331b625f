"""``python -m tidal.sim``: the simulator's command line."""

import logging

from tidal.sim.cli import sim_app

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
sim_app()
