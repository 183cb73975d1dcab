"""A least-recently-used memo whose values hold device memory, bounded by bytes as well as count.

functools.lru_cache bounds entries only. The backward's prepared launches hold their schedule's
task tables on the GPU (16 bytes a task: 4 MB for one 16k-token causal sequence at head_dim
128, 67 MB at 64k), so a job that meets many shapes (variable sequence lengths) would keep
gigabytes of them. Past the budget the least recently used entries go; their tensors are freed
like any other (stream-ordered, so kernels already queued keep reading valid memory).
"""
from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

V = TypeVar("V")


class BoundedCache(Generic[V]):
    """fn(*args) memoized: at most `max_entries` values, and at most `max_bytes` of
    `size(value)` among them (the newest entry always stays, whatever its size)."""

    def __init__(self, fn: Callable[..., V], max_entries: int, max_bytes: int,
                 size: Callable[[V], int]):
        self.fn, self.max_entries, self.max_bytes, self.size = fn, max_entries, max_bytes, size
        self._entries: dict[tuple, tuple[V, int]] = {}  # insertion order = use order
        self._bytes = 0
        self._lock = threading.Lock()
        self.__doc__, self.__wrapped__ = fn.__doc__, fn

    def __call__(self, *args) -> V:
        with self._lock:
            found = self._entries.pop(args, None)
            if found is not None:
                self._entries[args] = found  # most recently used: last
                return found[0]
        value = self.fn(*args)  # outside the lock: it may take seconds (a new plan)
        nbytes = int(self.size(value))
        with self._lock:
            old = self._entries.pop(args, None)  # another thread made it meanwhile
            if old is not None:
                self._bytes -= old[1]
            self._entries[args] = (value, nbytes)
            self._bytes += nbytes
            while len(self._entries) > 1 and (len(self._entries) > self.max_entries
                                              or self._bytes > self.max_bytes):
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
