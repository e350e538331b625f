"""A worker's pipe is drained whatever its log does: a sink that fails never blocks the
worker writing to it, and lines arrive again once the sink works."""

from __future__ import annotations

import errno
import sys
import threading

import pytest

from tidal.launch.process import LocalSpawner

pytestmark = pytest.mark.slow

#: 8 MiB, far more than a pipe holds: a reader that stops leaves the worker blocked.
FLOOD = (
    "import sys\n"
    "for i in range(8192): sys.stdout.write(f'{i:07d}' + 'z' * 1016 + '\\n')\n"
    "print('end', flush=True)\n"
)


def test_a_sink_that_raises_oserror_does_not_block_the_worker() -> None:
    delivered: list[str] = []
    failing = threading.Event()
    failing.set()

    def on_line(line: str) -> None:
        if failing.is_set():
            if len(delivered) == 0 and line.startswith("0004000"):
                failing.clear()  # space again, halfway through
            raise OSError(errno.ENOSPC, "No space left on device")
        delivered.append(line)

    process = LocalSpawner().spawn(
        worker_id="w0",
        slot="vm:0",
        argv=[sys.executable, "-c", FLOOD],
        env={},
        cwd=None,
        on_line=on_line,
    )
    try:
        assert process.wait(timeout=60) == 0, "the worker blocked writing to its pipe"
        process.drain(timeout=60)
    finally:
        process.kill()
    assert delivered[0].startswith("0004001")
    assert delivered[-1] == "end\n"
    assert len(delivered) == 8192 - 4001 + 1
