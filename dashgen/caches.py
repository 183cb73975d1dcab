"""dashgen's caches, all of one of two kinds, and `clear_caches()` that empties every one.

- `DiskCache`: content-addressed entries on disk (a data file and a JSON sidecar naming its
  sha256, both written atomically, the sidecar last), safe for concurrent processes. The cubins
  and the verified plans each keep one under the cache folder.
- `Memo`: an in-process memo bounded by entries and, where its values hold device memory, by
  bytes; the oldest entries leave first. A hit is one dictionary lookup, because several memos
  sit on the path of every attention call.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

CACHE_ENV = "DASHGEN_CACHE_DIR"

V = TypeVar("V")
# Every live memo, for clear_caches. Held weakly: a prepared launch owns the memo of its tensor
# maps, and the memo must leave with it (a process that meets new signatures all the time, as
# packs of varying lengths do, would otherwise keep every one it ever made).
_MEMOS: "weakref.WeakSet[Memo]" = weakref.WeakSet()
_MEMOS_LOCK = threading.Lock()


def cache_dir() -> Path:
    """The cache folder: $DASHGEN_CACHE_DIR, else ~/.cache/dashgen."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "dashgen")


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def digest(payload: Any) -> str:
    """The sha256 of a JSON-serializable key payload (sorted keys, so dict order is moot)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class DiskCache:
    """Entries `<folder>/<key[:2]>/<key><suffix>` plus `<key>.json`, the sidecar holding the
    caller's metadata and the data's sha256. A torn, foreign or unreadable entry reads as a
    miss; `put` raises OSError where the folder cannot be written (callers decide)."""

    def __init__(self, subfolder: str, suffix: str, format_version: int):
        self.subfolder, self.suffix, self.format = subfolder, suffix, format_version

    def paths(self, key: str, directory: Path | None = None) -> tuple[Path, Path]:
        folder = Path(directory) if directory is not None else cache_dir()
        if self.subfolder:
            folder = folder / self.subfolder
        folder = folder / key[:2]
        return folder / f"{key}{self.suffix}", folder / f"{key}.json"

    def get(self, key: str, directory: Path | None = None) -> tuple[bytes, dict] | None:
        """(data, metadata) of a complete entry, or None."""
        data_path, meta_path = self.paths(key, directory)
        try:
            meta = json.loads(meta_path.read_text())
            data = data_path.read_bytes()
        except (OSError, ValueError):
            return None
        if (not isinstance(meta, dict) or meta.get("format") != self.format
                or meta.get("sha256") != hashlib.sha256(data).hexdigest()):
            return None
        return data, meta

    def put(self, key: str, data: bytes, meta: dict, directory: Path | None = None) -> None:
        data_path, meta_path = self.paths(key, directory)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        meta = {**meta, "format": self.format, "sha256": hashlib.sha256(data).hexdigest()}
        # The sidecar goes last: it marks the entry complete and names the data's hash.
        atomic_write(data_path, data)
        atomic_write(meta_path, json.dumps(meta, indent=1, sort_keys=True).encode())


class Memo(Generic[V]):
    """fn(*args) memoized: at most `max_entries` values and, with `size`, at most `max_bytes`
    of size(value) among them (the newest entry always stays). Used as a decorator
    (`@memo(...)`) or directly (`Memo(fn, ...)`); `get(key, make)` memoizes under a key of the
    caller's choosing."""

    def __init__(self, fn: Callable[..., V] | None, max_entries: int,
                 max_bytes: int | None = None, size: Callable[[V], int] | None = None):
        self.fn, self.max_entries, self.max_bytes, self.size = fn, max_entries, max_bytes, size
        self._entries: dict[Any, tuple[V, int]] = {}  # insertion order: oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        if fn is not None:
            self.__doc__, self.__wrapped__ = fn.__doc__, fn
        with _MEMOS_LOCK:
            _MEMOS.add(self)

    def __call__(self, *args) -> V:
        found = self._entries.get(args)
        if found is not None:
            return found[0]
        return self._add(args, self.fn(*args))

    def get(self, key, make: Callable[[], V]) -> V:
        found = self._entries.get(key)
        if found is not None:
            return found[0]
        return self._add(key, make())

    def refile(self, key, value: V) -> None:
        """File `value` under `key` again, sized anew: for a value that came to hold device
        memory after it was filed, so that the byte bound counts it."""
        self._add(key, value)

    def _add(self, key, value: V) -> V:
        nbytes = int(self.size(value)) if self.size is not None else 0
        with self._lock:
            old = self._entries.pop(key, None)  # another thread made it meanwhile
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, nbytes)
            self._bytes += nbytes
            while len(self._entries) > 1 and (
                    len(self._entries) > self.max_entries
                    or (self.max_bytes is not None and self._bytes > self.max_bytes)):
                oldest = next(iter(self._entries))
                self._bytes -= self._entries.pop(oldest)[1]
        return value

    def cache_clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def cache_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


def memo(max_entries: int, max_bytes: int | None = None,
         size: Callable[[Any], int] | None = None) -> Callable[[Callable[..., V]], Memo[V]]:
    """Decorator form of Memo."""
    return lambda fn: Memo(fn, max_entries, max_bytes, size)


def clear_caches() -> None:
    """Empty every in-process memo (compiled kernels, plans, descriptors, selections). The disk
    caches stay: their keys name everything that decides their contents."""
    with _MEMOS_LOCK:
        memos = list(_MEMOS)
    for m in memos:
        m.cache_clear()
