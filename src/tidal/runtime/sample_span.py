"""Where the samples of the batch being computed sit in the job's data.

The loader publishes a :class:`SampleSpan` on the worker's context at every (micro-)batch;
per-sample random numbers (:mod:`~tidal.runtime.sample_rng`) are keyed by it. A module of
its own, below both, so that the context can hold a span without importing the random
number code that reads it from the context.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

#: Numbers the batches drawn in this process (see :attr:`SampleSpan.serial`).
_serials = itertools.count()


@dataclass(frozen=True)
class SampleSpan:
    """This rank's samples in the current (micro-)batch: positions ``start`` to
    ``start + count`` of epoch ``epoch``'s order, under the loader's ``seed``.
    ``serial`` counts the loader's batches (call counts restart with each one)."""

    seed: int
    epoch: int
    start: int
    count: int
    serial: int


def new_span(seed: int, epoch: int, start: int, count: int) -> SampleSpan:
    """The span of a batch just drawn (a fresh serial)."""
    return SampleSpan(seed, epoch, start, count, next(_serials))
