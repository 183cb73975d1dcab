"""dashgen.caches: the bounded in-process memo (entries and bytes, the newest always stays,
clear_caches empties every one) and the disk cache (a round trip, and anything torn or foreign
reads as a miss)."""
from __future__ import annotations

import hashlib
import json
import threading

import pytest

from dashgen.caches import CACHE_ENV, DiskCache, Memo, cache_dir, clear_caches, memo


def sized_memo(max_entries=3, max_bytes=None):
    calls = []

    def make(name, nbytes):
        calls.append(name)
        return (name, nbytes)
    return Memo(make, max_entries, max_bytes, size=lambda v: v[1]), calls


def test_a_hit_does_not_call_again():
    cache, calls = sized_memo()
    assert cache("a", 10) == ("a", 10) and cache("a", 10) == ("a", 10)
    assert calls == ["a"] and len(cache) == 1 and cache.cache_bytes() == 10


def test_past_the_entry_bound_the_oldest_goes_first():
    cache, calls = sized_memo(max_entries=3)
    for name in "abcd":
        cache(name, 1)
    assert len(cache) == 3
    cache("b", 1), cache("c", 1), cache("d", 1)
    assert calls == ["a", "b", "c", "d"]  # b, c and d stayed
    cache("a", 1)
    assert calls[-1] == "a" and len(cache) == 3  # a was the one dropped


def test_the_byte_bound_evicts_and_the_newest_always_stays():
    cache, calls = sized_memo(max_entries=10, max_bytes=100)
    cache("a", 60)
    cache("b", 30)
    assert cache.cache_bytes() == 90
    cache("c", 20)  # 110 > 100: a goes
    assert cache.cache_bytes() == 50 and len(cache) == 2
    cache("b", 30), cache("c", 20)
    assert calls == ["a", "b", "c"]
    cache("huge", 500)  # alone over the bound: kept, everything older goes
    assert len(cache) == 1 and cache.cache_bytes() == 500
    cache("huge", 500)
    assert calls == ["a", "b", "c", "huge"]
    cache.cache_clear()
    assert len(cache) == 0 and cache.cache_bytes() == 0


def test_get_memoizes_under_the_callers_key():
    cache = Memo(None, max_entries=2)
    made = []
    assert cache.get("k", lambda: made.append(1) or "v") == "v"
    assert cache.get("k", lambda: made.append(2) or "other") == "v"
    assert made == [1]


def test_the_decorator_keeps_the_docstring_and_clear_caches_empties_it():
    @memo(max_entries=4)
    def square(x):
        """x squared."""
        calls.append(x)
        return x * x

    calls = []
    assert square(3) == 9 and square(3) == 9 and calls == [3]
    assert square.__doc__ == "x squared."
    sized, _ = sized_memo(max_bytes=1000)
    sized("a", 7)
    clear_caches()
    assert len(square) == 0 and len(sized) == 0 and sized.cache_bytes() == 0
    assert square(3) == 9 and calls == [3, 3]


def test_refile_counts_a_value_that_grew_and_keeps_the_bound():
    """A value that takes on device memory after it was filed (a validated signature whose
    backward is prepared later) is sized again, and the byte bound then holds with its size."""
    sizes = {"a": 0, "b": 0}
    cache = Memo(None, max_entries=10, max_bytes=100, size=lambda name: sizes[name])
    cache.get("a", lambda: "a")
    cache.get("b", lambda: "b")
    assert cache.cache_bytes() == 0
    sizes["a"] = 60
    cache.refile("a", "a")
    assert cache.cache_bytes() == 60 and len(cache) == 2
    sizes["b"] = 50
    cache.refile("b", "b")  # 110 > 100: the oldest, a, goes
    assert cache.cache_bytes() == 50 and list(cache._entries) == ["b"]


def test_a_memo_leaves_clear_caches_list_with_its_owner():
    """A prepared launch owns the memo of its tensor maps: once the launch is dropped, nothing
    keeps the memo (and the descriptors in it) alive, however many launches a process makes."""
    import gc
    import weakref

    from dashgen import caches

    class Owner:
        def __init__(self):
            self.maps = Memo(None, max_entries=4)

    owner = Owner()
    owner.maps.get("address", lambda: "descriptor")
    gone = weakref.ref(owner.maps)
    assert owner.maps in list(caches._MEMOS)
    del owner
    gc.collect()
    assert gone() is None
    clear_caches()  # still empties the memos that live


def test_threads_share_a_memo_and_its_accounting_stays_exact():
    cache, _ = sized_memo(max_entries=8, max_bytes=1000)

    def work(offset):
        for i in range(2000):
            cache(f"k{(i * 7 + offset) % 20}", 30)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) <= 8 and cache.cache_bytes() == 30 * len(cache)


# -- DiskCache -----------------------------------------------------------------------------------

KEY = "ab" + "0" * 62


def test_put_then_get_round_trips_data_and_metadata(tmp_path):
    cache = DiskCache(subfolder="things", suffix=".bin", format_version=3)
    assert cache.get(KEY, tmp_path) is None
    cache.put(KEY, b"\x00payload", {"name": "x", "count": 2}, tmp_path)
    data, meta = cache.get(KEY, tmp_path)
    assert data == b"\x00payload"
    assert meta["name"] == "x" and meta["count"] == 2 and meta["format"] == 3
    assert meta["sha256"] == hashlib.sha256(data).hexdigest()
    data_path, meta_path = cache.paths(KEY, tmp_path)
    assert data_path == tmp_path / "things" / "ab" / f"{KEY}.bin"
    assert meta_path == tmp_path / "things" / "ab" / f"{KEY}.json"
    assert not list(tmp_path.rglob("*.tmp"))  # the atomic writes left no temporary file


def test_the_folder_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert cache_dir() == tmp_path / "env"
    cache = DiskCache(subfolder="", suffix=".cubin", format_version=1)
    cache.put(KEY, b"bytes", {}, None)
    assert (tmp_path / "env" / "ab" / f"{KEY}.cubin").read_bytes() == b"bytes"
    assert cache.get(KEY) is not None


@pytest.mark.parametrize("damage", ["torn data", "missing data", "no sidecar", "sidecar not json",
                                    "sidecar a list", "other format", "other hash"])
def test_a_torn_or_foreign_entry_is_a_miss(tmp_path, damage):
    cache = DiskCache(subfolder="", suffix=".bin", format_version=1)
    cache.put(KEY, b"0123456789", {"name": "x"}, tmp_path)
    data_path, meta_path = cache.paths(KEY, tmp_path)
    meta = json.loads(meta_path.read_text())
    if damage == "torn data":
        data_path.write_bytes(b"01234")
    elif damage == "missing data":
        data_path.unlink()
    elif damage == "no sidecar":
        meta_path.unlink()
    elif damage == "sidecar not json":
        meta_path.write_text("{not json")
    elif damage == "sidecar a list":
        meta_path.write_text("[1, 2]")
    elif damage == "other format":
        meta_path.write_text(json.dumps({**meta, "format": 2}))
    else:
        meta_path.write_text(json.dumps({**meta, "sha256": "0" * 64}))
    assert cache.get(KEY, tmp_path) is None
    cache.put(KEY, b"0123456789", {"name": "x"}, tmp_path)  # a put repairs the entry
    assert cache.get(KEY, tmp_path)[0] == b"0123456789"


def test_put_into_a_folder_that_cannot_exist_raises_oserror(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cache = DiskCache(subfolder="", suffix=".bin", format_version=1)
    with pytest.raises(OSError):
        cache.put(KEY, b"x", {}, blocker)
    assert cache.get(KEY, blocker) is None
