"""The cache of what was read of immutable table files: loaded once, least recently used out past the budget, and
a kept value's file that is gone loaded again (so its reading fails as it would without the cache)."""

from __future__ import annotations

import pytest

from krishiv_core.file_cache import FileCache


def test_values_are_loaded_once_and_the_least_recently_used_go_past_the_budget() -> None:
    loads: list[str] = []
    cache: FileCache[str] = FileCache(10, len)

    def get(key: str) -> str:
        return cache.get(key, lambda: loads.append(key) or key * 4)

    assert get("a") == "aaaa" and get("a") == "aaaa" and loads == ["a"]
    get("b")
    get("a")  # a is now the most recently used
    get("c")  # 12 bytes: b goes
    assert cache.bytes == 8
    get("a")
    get("b")
    assert loads == ["a", "b", "c", "b"]
    assert cache.get("big", lambda: "x" * 11) == "x" * 11 and cache.bytes <= 10, "larger than the budget: not kept"


def test_a_kept_value_whose_file_is_gone_is_loaded_again() -> None:
    cache: FileCache[str] = FileCache(100, len)
    cache.get("f", lambda: "keys")

    def gone() -> str:
        raise FileNotFoundError("f")

    assert cache.get("f", gone, still_there=lambda: True) == "keys"
    with pytest.raises(FileNotFoundError):
        cache.get("f", gone, still_there=lambda: False)
