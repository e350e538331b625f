"""A model's training script as the registry runs it: its parameters from
``TIDAL_PARAMS`` (its own defaults when run by hand), its data from ``TIDAL_DATASET``.

It fits ``y = w·x`` to the dataset's ``data.csv`` (one ``x,y`` row a line) by gradient
descent for ``epochs`` epochs at learning rate ``lr``, reports ``loss`` and ``rows``,
and writes ``{"params": ..., "w": ...}`` to ``model.json`` in its checkpoint dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import tidal

DEFAULTS = {"epochs": 1, "lr": 0.01}


def main() -> None:
    params = {**DEFAULTS, **json.loads(os.environ.get("TIDAL_PARAMS", "{}"))}
    data = Path(os.environ.get("TIDAL_DATASET", ".")) / "data.csv"
    rows = [tuple(map(float, line.split(","))) for line in data.read_text().split()]
    tidal.init()
    w = 0.0
    loss = 0.0
    for epoch in range(int(params["epochs"])):
        grad = sum(2 * (w * x - y) * x for x, y in rows) / len(rows)
        w -= float(params["lr"]) * grad
        loss = sum((w * x - y) ** 2 for x, y in rows) / len(rows)
        tidal.log_metrics(step=epoch + 1, loss=loss, rows=len(rows))
    out = Path(os.environ.get("TIDAL_CHECKPOINT_DIR", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.json").write_text(json.dumps({"params": params, "w": w, "loss": loss}))


if __name__ == "__main__":
    main()
