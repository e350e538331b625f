"""Every verb's help shows its defaults: no help text is swallowed as rich markup."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.text import Text
from typer.core import TyperGroup

from tidal.cli.main import app
from tidal.sim.cli import sim_app


def _commands(command: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, f"{path} {name}")


def _help_texts() -> Iterator[tuple[str, str]]:
    roots = [("tidal", typer.main.get_command(app)), ("tidal sim", typer.main.get_command(sim_app))]
    for root_path, root in roots:
        for path, command in _commands(root, root_path):
            if command.help:
                yield path, command.help
            for param in command.params:
                help_text = getattr(param, "help", None)
                if help_text:
                    yield f"{path} {param.name}", help_text


def test_no_help_text_reads_as_markup() -> None:
    swallowed = [
        (where, text) for where, text in _help_texts() if Text.from_markup(text).plain != text
    ]
    assert swallowed == []


def _help(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tidal.cli", *argv, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("argv", "defaults"),
    [
        (
            ["server"],
            [
                "[default: 0]",
                "[default: (one per GPU, else per core)]",
                "[default: (SQLite in the data dir)]",
                "[default: (one per slot up to 4, as memory allows)]",
            ],
        ),
        (["run"], ["[default: ($TIDAL_TIMEOUT or 10)]", "[default: ($TIDAL_SYNC_EVERY or 1)]"]),
    ],
)
def test_help_shows_defaults(argv: list[str], defaults: list[str]) -> None:
    text = _help(*argv)
    for default in defaults:
        assert default in text, text
