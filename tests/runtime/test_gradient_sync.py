"""Which all-reduce serves a job's gradients: DDP's own on NCCL, the guarded hook on gloo
and whenever the adaptive batch size reads the gradient's statistics."""

from __future__ import annotations

import pytest

from tidal.runtime.env import ConfigError, RuntimeConfig
from tidal.runtime.parallel import native_allreduce


@pytest.mark.parametrize(
    ("setting", "backend", "measuring", "native"),
    [
        ("auto", "nccl", False, True),
        ("auto", "gloo", False, False),
        ("auto", "nccl", True, False),
        ("native", "gloo", False, True),
        ("native", "nccl", True, False),
        ("guarded", "nccl", False, False),
        ("guarded", "gloo", False, False),
    ],
)
def test_native_allreduce_where_the_guard_buys_nothing(
    setting: str, backend: str, measuring: bool, native: bool
) -> None:
    assert native_allreduce(setting, backend, measuring=measuring) is native


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDAL_GRADIENT_SYNC", raising=False)
    assert RuntimeConfig.from_env().gradient_sync == "auto"
    monkeypatch.setenv("TIDAL_GRADIENT_SYNC", "native")
    assert RuntimeConfig.from_env().gradient_sync == "native"


def test_a_wrong_setting_names_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDAL_GRADIENT_SYNC", "fast")
    with pytest.raises(ConfigError, match=r"TIDAL_GRADIENT_SYNC: expected one of auto, native"):
        RuntimeConfig.from_env()
