"""Run a block with one intra-op torch thread, restoring the previous count afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread for the block.

    Used where the work is tiny ops (the blend head has 12 parameters, tracer_plus's scorer a few
    dozen) or single short encodes (latency timing): there every parallel region costs a
    synchronisation, and on a busy 2-core CPU we measured 20 ms per op with 2 threads against 0.1 ms
    with 1. One thread also fixes the reductions' order, so training is deterministic.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
