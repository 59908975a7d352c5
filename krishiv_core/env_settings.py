"""Durations and shares read from ``KRISHIV_*`` environment variables, with one error for every layer that reads one."""

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


def fraction_from_env(variable: str, default: float) -> float:
    """``variable`` as a share from 0 to 1 (``0.5``, or ``50%``), ``default`` when unset or empty; else one
    ``ConfigError``."""
    raw = os.environ.get(variable)
    if not raw:
        return default
    text = raw.strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(variable, f"expected a share from 0 to 1 (such as 0.5, or 50%), got {raw!r}") from None
    if not 0 <= share <= 1:
        raise ConfigError(variable, f"expected a share from 0 to 1 (such as 0.5, or 50%), got {raw!r}")
    return share
