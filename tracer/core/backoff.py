"""How long tracer waits before trying again: one exponential back-off, for the three things that retry.

- The OpenAI executor's request (:mod:`tracer.executors.openai`): tenacity states which errors are
  retried and how many attempts are made; this gives its wait (or the server's ``Retry-After`` when
  that is longer).
- A lost MCP upstream (:mod:`tracer.serve.mcp.upstreams`): this wait before each reconnection, counted
  from the last time it connected.
- An index version that failed to load (:mod:`tracer.serve.reload`): a poll does not try it again before
  this wait has passed since the last failure.

The last two are not a call to retry, so they keep their own loop (a reconnection that succeeds serves
for hours before it is lost again) and gate (a reload is retried by a later poll, not by sleeping); what
they share with the first is this schedule, defined once.
"""

from __future__ import annotations

import math

# 2.0 ** 1024 overflows a float; every cap is reached long before
_MAX_DOUBLINGS = 1023


def backoff_s(first: float, retry: int, cap: float = math.inf) -> float:
    """Seconds to wait before retry number ``retry`` (1 for the first): ``first``, doubled at each retry,
    at most ``cap``. A ``first`` above ``cap`` is kept for the first retry, as the caller asked for it.

    >>> [backoff_s(0.5, n) for n in (1, 2, 3, 4)]
    [0.5, 1.0, 2.0, 4.0]
    >>> [backoff_s(1.0, n, cap=60.0) for n in (1, 6, 7, 2000)]
    [1.0, 32.0, 60.0, 60.0]
    >>> [backoff_s(90.0, n, cap=60.0) for n in (1, 2)]
    [90.0, 60.0]
    """
    if retry <= 1:
        return first
    return min(cap, first * 2.0 ** min(retry - 1, _MAX_DOUBLINGS))
