"""Run a block with one intra-op torch thread, restoring the previous count afterwards; name the host's
CPU."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

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


def machine() -> str:
    """The processor and CPU count (Linux ``/proc/cpuinfo``): latency is the host's, so each benchmark output
    names it."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 "unknown processor")
    return f"{model}, {os.cpu_count()} CPUs"
