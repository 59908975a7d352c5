"""Durations read from ``KRISHIV_*`` environment variables, with one error for every layer that reads one."""

from __future__ import annotations

import os

from krishiv_core.errors import ConfigError


def seconds_from_env(variable: str, default: float) -> float:
    """``variable`` as a positive number of seconds, ``default`` when unset or empty; else one ``ConfigError``."""
    raw = os.environ.get(variable)
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(variable, f"expected a number of seconds, got {raw!r}") from None
    if not seconds > 0:
        raise ConfigError(variable, f"expected a positive number of seconds, got {raw!r}")
    return seconds
