"""tracer.core.lru.LRU, the one bounded map: which entry goes first, what the eviction hook hears, the count
bound beside a size bound, and the reads that must not reorder it. Each case evicts and checks which keys
are left, so a read that did reorder the map would leave a different set."""

from __future__ import annotations

import pytest

from tracer.core.lru import LRU


def filled(n: int, **kw) -> tuple[LRU, list[tuple[str, int]]]:
    evicted: list[tuple[str, int]] = []
    lru = LRU(n, on_evict=lambda k, v: evicted.append((k, v)), **kw)
    for i in range(n):
        lru[f"k{i}"] = i
    return lru, evicted


def test_the_least_recently_used_goes_first_and_the_hook_hears_it():
    lru, evicted = filled(3)
    assert lru["k0"] == 0          # a read makes k0 recent: k1 is now the oldest
    lru["k3"] = 3
    lru["k1"] = 10                 # not held: set anew, evicting k2
    assert evicted == [("k1", 1), ("k2", 2)]
    assert sorted(lru) == ["k0", "k1", "k3"] and lru.peek("k1") == 10


def test_pop_and_del_are_not_evictions():
    lru, evicted = filled(2)
    assert lru.pop("k0") == 0
    del lru["k1"]
    assert evicted == [] and len(lru) == 0


@pytest.mark.parametrize("read", ["peek", "values", "items", "in"])
def test_reads_that_use_nothing_leave_the_order_alone(read):
    lru, evicted = filled(3)
    if read == "peek":
        assert lru.peek("k0") == 0 and lru.peek("absent", "none") == "none"
    elif read == "values":
        assert sorted(lru.values()) == [0, 1, 2]
    elif read == "items":
        assert sorted(lru.items()) == [("k0", 0), ("k1", 1), ("k2", 2)]
    else:
        assert "k0" in lru
    lru["k3"] = 3
    assert evicted == [("k0", 0)]   # k0 was still the oldest


def test_a_size_bound_and_a_count_bound_together():
    evicted: list[str] = []
    lru = LRU(10, getsizeof=len, on_evict=lambda k, v: evicted.append(k), max_items=2)
    lru["a"] = "xxxx"
    lru["b"] = "xxxx"
    lru["c"] = "x"                 # 9 bytes would fit; three entries would not: a goes
    assert evicted == ["a"] and lru.currsize == 5
    lru["d"] = "xxxxxxxx"          # 13 bytes would not fit: b goes, and c (1 byte) stays beside d
    assert evicted == ["a", "b"] and sorted(lru) == ["c", "d"] and lru.currsize == 9
    with pytest.raises(ValueError, match="max_items"):
        LRU(10, max_items=0)


def test_a_value_that_can_never_fit_is_evicted_as_it_is_set():
    evicted: list[tuple[str, object]] = []
    off = LRU(0, on_evict=lambda k, v: evicted.append((k, v)))
    off["k"] = 1
    assert len(off) == 0 and off.get("k") is None and evicted == [("k", 1)]
    lru = LRU(4, getsizeof=len, on_evict=lambda k, v: evicted.append((k, v)))
    lru["a"] = "xx"
    lru["b"] = "xxxxx"             # larger than the whole map: evicted itself, and a stays
    assert list(lru) == ["a"] and evicted[1:] == [("b", "xxxxx")]


def test_an_owner_that_pops_and_sets_at_each_use_iterates_least_recently_used_first():
    """What the MCP session table and the log's pending conversations rely on to find idle entries at the
    front (tracer.core.lru, "Iteration order"): checked against the installed cachetools."""
    lru, evicted = filled(4)
    for key in ("k1", "k0", "k3"):         # each use: pop, then set again
        lru[key] = lru.pop(key)
    assert list(lru) == ["k2", "k1", "k0", "k3"]
    assert lru.first() == ("k2", 2) and [v for _, v in lru.items()] == list(lru.values()) == [2, 1, 0, 3]
    lru["k4"] = 4                          # the first in iteration is the one evicted
    assert evicted == [("k2", 2)] and lru.first() == ("k1", 1)
    with pytest.raises(KeyError):
        LRU(1).first()
