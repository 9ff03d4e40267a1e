"""The one bounded least-recently-used map behind every in-memory cache and table tracer keeps.

It is ``cachetools.LRUCache``: ``maxsize`` entries, or ``maxsize`` in any unit when ``getsizeof`` gives
each value's size (the log's pending conversations are bounded in bytes); reading an entry (``lru[key]``,
``get``) or setting it makes it the most recently used, and room is made by dropping the least recently
used first. :class:`LRU` adds only what our maps need and cachetools does not do:

- ``on_evict(key, value)`` is called for each entry dropped to make room, so eviction can act (close a
  session, count a dropped conversation, forget a conversation's points). cachetools evicts through
  ``popitem``; overriding it once here is its documented way to do this.
- ``max_items``: a count bound beside a ``getsizeof`` bound (at most N conversations *and* B bytes of
  them). Entries are dropped for the size before a value is set, then for the count after.
- :meth:`peek`, :meth:`first`, :meth:`values` and :meth:`items` read without making anything recent.
  The ones ``MutableMapping`` supplies read through ``__getitem__``, so scanning the map would reorder
  all of it.
- ``maxsize=0`` keeps nothing (an embedding cache turned off): a value that can never fit is evicted as
  it is set (``on_evict`` hears it), where cachetools would raise "value too large".

**Iteration order.** cachetools keeps the entries in a dict, so iterating (``for key in lru``,
:meth:`items`, :meth:`first`) follows the order keys were added: setting a key that is held keeps its
place, and ``pop`` then set moves it to the end. An owner that pops and sets an entry at each use (the MCP
session table, the log's pending conversations) therefore iterates least recently used first, and finds
its idle entries at the front without a scan; tests/unit/core/test_lru.py pins this against the
installed cachetools. Not thread-safe: every owner holds its own lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

from cachetools import Cache, LRUCache

_MISSING = object()


class LRU(LRUCache):
    """A ``cachetools.LRUCache`` with an eviction hook, an optional count bound and reads that use nothing.

    Args:
        maxsize: the bound: entries, or the sum of ``getsizeof(value)`` when that is given.
        getsizeof: a value's size (default: 1 each).
        on_evict: called with ``(key, value)`` for every entry dropped to make room, or set and never
            fitting (not for ``pop`` or ``del``: the caller already knows about those).
        max_items: at most this many entries as well (with ``getsizeof``; None: no count bound).
    """

    def __init__(self, maxsize: int, getsizeof: Callable[[Any], int] | None = None,
                 on_evict: Callable[[Any, Any], None] | None = None, max_items: int | None = None):
        if max_items is not None and max_items < 1:
            raise ValueError(f"LRU max_items must be at least 1, got {max_items}")
        super().__init__(maxsize, getsizeof)
        self.on_evict = on_evict
        self.max_items = max_items

    def __setitem__(self, key: Hashable, value: Any) -> None:
        if self.getsizeof(value) > self.maxsize:  # never fits (maxsize 0): evicted at once, nothing else
            self.pop(key, None)
            if self.on_evict is not None:
                self.on_evict(key, value)
            return
        super().__setitem__(key, value)
        while self.max_items is not None and len(self) > self.max_items:
            self.popitem()

    def popitem(self) -> tuple[Any, Any]:
        """Drop the least recently used entry, tell ``on_evict``, and return it."""
        key, value = super().popitem()
        if self.on_evict is not None:
            self.on_evict(key, value)
        return key, value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (``default`` if absent), without making it recently used."""
        return Cache.__getitem__(self, key) if key in self else default

    def first(self) -> tuple[Any, Any]:
        """The ``(key, value)`` first in iteration order (module docstring), without making it recently
        used; KeyError when empty."""
        for key in self:
            return key, Cache.__getitem__(self, key)
        raise KeyError("first(): the LRU is empty")

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        """Every value in iteration order, without making any recently used."""
        return (Cache.__getitem__(self, key) for key in self)

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        """Every ``(key, value)`` in iteration order, without making any recently used."""
        return ((key, Cache.__getitem__(self, key)) for key in self)
