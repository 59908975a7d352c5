"""What a process keeps in memory of table files, read once and reused by every later merge.

A data or delete file of an Iceberg table never changes once written (a new content is a new file, under a new
path), so what a merge reads of one (its key columns, its Bloom filters, the positions a delete file deletes) holds
for every later merge in the process: the relay beside a continuous query merges batch after batch into the same
files. Entries are kept up to a byte budget, least recently used out first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """Values read from immutable files, by key (a path and what was read of it), within ``limit_bytes``."""

    def __init__(self, limit_bytes: int, size: Callable[[T], int]) -> None:
        self.limit_bytes = limit_bytes
        self._size = size
        self._values: OrderedDict[Hashable, T] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, load: Callable[[], T], still_there: Callable[[], bool] | None = None) -> T:
        """The value for ``key``, loaded (outside the lock) when not kept; a value larger than the budget is not.
        ``still_there``: asked of a kept value's file, which is loaded again (failing as its reading fails) when
        gone, so a file removed from under a table is noticed as if it were read."""
        with self._lock:
            kept = key in self._values
            if kept:
                self._values.move_to_end(key)
                value = self._values[key]
        if kept and (still_there is None or still_there()):
            return value
        value = load()
        size = self._size(value)
        with self._lock:
            if key not in self._values and size <= self.limit_bytes:
                self._values[key] = value
                self._bytes += size
                while self._bytes > self.limit_bytes:
                    _, dropped = self._values.popitem(last=False)
                    self._bytes -= self._size(dropped)
        return value

    @property
    def bytes(self) -> int:
        return self._bytes
