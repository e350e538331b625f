"""The SDK and the command's help stay light: no torch, no server stack, no Ray.

Each check runs in a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "ray")

_PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def loaded_after(body: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``body``."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def _cli(*args: str) -> str:
    # main() exits; the probe's last line still runs in the finally clause.
    return (
        "import contextlib, io\n"
        f"sys.argv = ['tidal', *{list(args)!r}]\n"
        "from tidal.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main()"
    )


@pytest.mark.parametrize(
    "body",
    [
        "import tidal",
        "import tidal.client",
        "from tidal.client import Client; import tidal.wire.schema, tidal.spec",
        _cli("--help"),
        _cli("list", "--help"),
        _cli("submit", "--help"),
        _cli("server", "--help"),
        _cli("run", "--help"),
        _cli("resize", "--help"),
        _cli("sim", "--help"),
        _cli("workers", "launch", "--help"),
        "from tidal.client import Client; import tidal.client.workers, tidal.client.ps_cluster",
    ],
    ids=[
        "tidal",
        "tidal.client",
        "sdk-and-wire-types",
        "tidal--help",
        "list--help",
        "submit--help",
        "server--help",
        "run--help",
        "resize--help",
        "sim--help",
        "workers-launch--help",
        "worker-verbs-and-ps-spec",
    ],
)
def test_stays_light(body: str) -> None:
    assert loaded_after(body) == []


def test_the_training_api_loads_on_first_use() -> None:
    body = (
        "import tidal\n"
        "assert 'init' in dir(tidal) and 'torch' not in sys.modules\n"
        "from tidal import ElasticDataParallel, init\n"
        "from tidal.runtime import init as runtime_init\n"
        "assert init is runtime_init and tidal.init is init\n"
        "try:\n"
        "    tidal.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')"
    )
    assert loaded_after(body) == ["torch"]
