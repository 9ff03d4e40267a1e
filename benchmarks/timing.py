"""Thread CPU time of a step, the measure every per-step benchmark reports (shared, not a script)."""

from __future__ import annotations

import time

import numpy as np


def cpu_us(fn, n: int, repeats: int = 3) -> np.ndarray:
    """Thread CPU time of ``fn(i)`` for i < n, best of ``repeats`` passes per i, in microseconds ``[n]``."""
    for i in range(min(50, n)):  # warm-up
        fn(i)
    out = np.empty((repeats, n))
    for r in range(repeats):
        for i in range(n):
            t0 = time.thread_time_ns()
            fn(i)
            out[r, i] = (time.thread_time_ns() - t0) / 1000
    return out.min(0)
