"""Set-up shared by every test module."""

from __future__ import annotations

import anyio

# anyio imports most of its API lazily, on first use. Under pytest its modules are
# assertion-rewritten on import (anyio registers a pytest plugin), which parses them with
# `ast`; a first use inside a test server's thread while the main thread imports another
# module trips CPython 3.11's AST constructor, which is not thread-safe ("SystemError: AST
# constructor recursion depth mismatch"). Load all of it here, in the main thread, first.
for _name in dir(anyio):
    getattr(anyio, _name)


import logging  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Undo what a CLI run in-process did to the root logger (``basicConfig`` with
    ``force=True``): its handler writes to the test's captured stream, which is closed
    after the test, and any later log record would then print a traceback to stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _gpu_problem(needed: int) -> str | None:
    """Why ``needed`` CUDA GPUs cannot be used here, or ``None`` if they can."""
    import torch

    if torch.version.cuda is None:
        return f"needs CUDA: torch {torch.__version__} is a build without CUDA"
    if not torch.cuda.is_available():
        return f"needs CUDA: torch {torch.__version__} sees no GPU (torch.cuda.is_available())"
    found = torch.cuda.device_count()
    if found < needed:
        return f"needs {needed} CUDA GPUs, {found} visible"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``gpu`` (``gpu(N)``: N GPUs, default 1) where CUDA or enough
    GPUs are absent, saying which; torch loads only when such a test was collected."""
    problems: dict[int, str | None] = {}
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        needed = int(marker.args[0]) if marker.args else 1
        if needed not in problems:
            problems[needed] = _gpu_problem(needed)
        problem = problems[needed]
        if problem is not None:
            item.add_marker(pytest.mark.skip(reason=problem))
