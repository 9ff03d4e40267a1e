"""tracer.core.backoff.backoff_s, the one retry schedule, against the three schedules it replaced, written
out as they were: the executor's ``backoff_s * 2**attempt``, an upstream's delay doubled up to 60 s after
each failed reconnection, and the reload's ``min(300, 2.0 ** (attempts - 1))``. Equal to the bit."""

from __future__ import annotations

import math

import pytest

from tracer.core.backoff import backoff_s


@pytest.mark.parametrize("first", [0.01, 0.5, 1.0, 3.0])
def test_the_executors_waits(first):
    assert [backoff_s(first, attempt + 1) for attempt in range(12)] == [first * 2**a for a in range(12)]


@pytest.mark.parametrize("first", [0.1, 1.0, 7.0, 60.0, 90.0])  # 90: a first delay above the cap
def test_an_upstreams_reconnection_waits(first):
    delays, delay = [], first
    for _ in range(12):
        delays.append(delay)
        delay = min(2 * delay, 60.0)
    assert [backoff_s(first, n, cap=60.0) for n in range(1, 13)] == delays


def test_the_reloads_waits_and_no_overflow_however_long_a_version_fails():
    assert [backoff_s(1.0, k, cap=300.0) for k in range(1, 15)] == [min(300.0, 2.0 ** (k - 1))
                                                                     for k in range(1, 15)]
    # the reload's own 2.0 ** (attempts - 1) raised OverflowError from the 1,025th failure in a row
    assert backoff_s(1.0, 5000, cap=300.0) == 300.0 and backoff_s(1.0, 5000) == 2.0 ** 1023
    assert backoff_s(4.0, 5000) == math.inf      # uncapped and past a float: wait for ever, no exception
