"""A value guarded from a collective on another CUDA stream is ready on the caller's
stream once ``wait()`` returns: ``WorkerContext.guard`` keeps NCCL's stream order.

A world-1 job on a GPU. The "collective" is a CUDA-aware future completed on a side
stream behind a ~0.1 s sleep kernel, as NCCL's futures are completed at launch, long
before their kernels end. After ``guard(...).wait()``, ``.item()`` (which waits for the
caller's stream only) must see the value the side stream writes, not the zero before it.
"""

from __future__ import annotations

import torch

import tidal


def main() -> None:
    ctx = tidal.init()
    assert ctx.device.type == "cuda", ctx.device
    value = torch.zeros(1, device=ctx.device)
    side = torch.cuda.Stream(ctx.device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(ctx.device))  # the zero is written first
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]  # ~0.1 s at 2 GHz
        value.fill_(1.0)
        source: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=[ctx.device])
        source.set_result(value)  # records its event on the side stream, as NCCL does
    seen = ctx.guard(source, lambda: value, device=value.device).wait().item()
    print(f"seen {seen}", flush=True)
    assert seen == 1.0, "wait() returned before the side stream had written the value"


if __name__ == "__main__":
    main()
