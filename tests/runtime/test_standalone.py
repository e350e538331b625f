"""A script using the runtime runs alone, without any launcher, as world 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"


@pytest.mark.slow
def test_digits_example_alone_reaches_95_percent(tmp_path: Path) -> None:
    result_file = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--epochs", "10", "--result", str(result_file)],
        check=True,
        timeout=180,
        capture_output=True,
    )
    result = json.loads(result_file.read_text())
    assert result["accuracy"] > 0.95
    assert result["steps"] == 10 * -(-1437 // 64)
