"""Which all-reduce serves a job's gradients: DDP's own on NCCL, DDP's own behind the
guarded group on gloo (CPU tensors), the hook whenever the adaptive batch size reads the
gradient's statistics."""

from __future__ import annotations

import pytest

from tidal.runtime.env import ConfigError, RuntimeConfig
from tidal.runtime.parallel import choose_gradient_sync


@pytest.mark.parametrize(
    ("setting", "backend", "device", "measuring", "sync"),
    [
        ("auto", "nccl", "cuda", False, "native"),
        ("auto", "gloo", "cpu", False, "guarded"),
        ("auto", "gloo", "cuda", False, "hook"),
        ("auto", "nccl", "cuda", True, "hook"),
        ("auto", "gloo", "cpu", True, "hook"),
        ("native", "gloo", "cpu", False, "native"),
        ("native", "nccl", "cuda", True, "hook"),
        ("guarded", "gloo", "cpu", False, "guarded"),
        ("guarded", "nccl", "cuda", False, "hook"),
        ("hook", "gloo", "cpu", False, "hook"),
        ("hook", "nccl", "cuda", False, "hook"),
    ],
)
def test_each_setting_and_backend_takes_its_gradient_sync(
    setting: str, backend: str, device: str, measuring: bool, sync: str
) -> None:
    assert choose_gradient_sync(setting, backend, device, measuring=measuring) == sync


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDAL_GRADIENT_SYNC", raising=False)
    assert RuntimeConfig.from_env().gradient_sync == "auto"
    monkeypatch.setenv("TIDAL_GRADIENT_SYNC", "native")
    assert RuntimeConfig.from_env().gradient_sync == "native"
    monkeypatch.setenv("TIDAL_GRADIENT_SYNC", "hook")
    assert RuntimeConfig.from_env().gradient_sync == "hook"


def test_a_wrong_setting_names_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDAL_GRADIENT_SYNC", "fast")
    with pytest.raises(ConfigError, match=r"TIDAL_GRADIENT_SYNC: expected one of auto, native"):
        RuntimeConfig.from_env()
