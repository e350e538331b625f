"""The high-level Trainer under a real launcher with a resize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runtime.launcher import Launch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_trainer.py"
EPOCHS = 200


@pytest.mark.slow
def test_trainer_reaches_95_percent_while_resized(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    launch = Launch(
        [
            "--workers",
            "1:3",
            "--initial",
            "2",
            "--resize-at",
            "20:3,60:1",
            "--",
            str(EXAMPLE),
            "--epochs",
            # Long enough that the grow at step 20 lands before training ends even when
            # the newcomer's start (Python, torch) is slow on a loaded machine.
            str(EPOCHS),
            "--result",
            str(result),
        ],
        home=tmp_path,
    )
    try:
        assert launch.finish(timeout=240) == 0, launch.output()
    finally:
        launch.close()
    final = json.loads(result.read_text())
    assert final["val_accuracy"] > 0.95, final
    assert final["epoch"] == EPOCHS - 1
    assert "generation 1 (resize)" in launch.output()
