"""The memo that holds the backward's prepared launches: least recently used out first, within
a count and a byte budget."""
from __future__ import annotations

import threading

from dashgen.caches import BoundedCache


def sized_cache(max_entries=3, max_bytes=100):
    calls = []

    def make(name, nbytes):
        calls.append(name)
        return (name, nbytes)
    return BoundedCache(make, max_entries, max_bytes, size=lambda v: v[1]), calls


def test_hits_do_not_call_again():
    cache, calls = sized_cache()
    assert cache("a", 10) == ("a", 10) and cache("a", 10) == ("a", 10)
    assert calls == ["a"] and len(cache) == 1 and cache.cache_bytes() == 10


def test_the_least_recently_used_goes_first_past_the_count():
    cache, calls = sized_cache(max_entries=3)
    for name in "abc":
        cache(name, 1)
    cache("a", 1)  # a is now the most recent: b is the oldest
    cache("d", 1)
    cache("a", 1), cache("c", 1), cache("d", 1)
    assert calls == ["a", "b", "c", "d"]  # no rebuild of a, c or d
    cache("b", 1)
    assert calls[-1] == "b" and len(cache) == 3


def test_the_byte_budget_evicts_and_the_newest_always_stays():
    cache, calls = sized_cache(max_entries=10, max_bytes=100)
    cache("a", 60)
    cache("b", 30)
    assert cache.cache_bytes() == 90
    cache("c", 20)  # 110 > 100: a goes
    assert cache.cache_bytes() == 50 and len(cache) == 2
    cache("huge", 500)  # alone over the budget: kept, everything older goes
    assert len(cache) == 1 and cache.cache_bytes() == 500
    cache("huge", 500)
    assert calls == ["a", "b", "c", "huge"]
    cache.cache_clear()
    assert len(cache) == 0 and cache.cache_bytes() == 0


def test_threads_share_it_and_its_accounting_stays_exact():
    cache, _ = sized_cache(max_entries=8, max_bytes=1000)

    def work(offset):
        for i in range(2000):
            cache(f"k{(i * 7 + offset) % 20}", 30)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) <= 8 and cache.cache_bytes() == 30 * len(cache)
