"""When rejects are a storm: the rule ``krishiv run``, ``status``, ``check`` and the Dagster check share, and its
setting (the CLI on a real all-rejects pipeline: ``tests/krishiv/test_reject_storms.py``)."""

from __future__ import annotations

import pytest

from krishiv_core.errors import ConfigError
from krishiv_core.reject_rate import (
    DEFAULT_REJECT_RATE_WARN,
    REJECT_RATE_ENV,
    CommonReason,
    RejectRate,
    most_common_reason,
    reject_rate_warn,
)


@pytest.mark.parametrize(
    ("read", "rejects", "warn_above", "alarming"),
    [
        (8000, 8000, 0.5, True),  # every record rejected
        (8000, 8000, 1.0, True),  # ... whatever the share
        (10, 6, 0.5, True),  # more than the share
        (10, 5, 0.5, False),  # the share itself is not more than it
        (10, 1, 0.5, False),
        (10, 1, 0.0, True),  # a share of 0 warns of any reject
        (10, 0, 0.0, False),
        (0, 0, 0.5, False),  # nothing read: no rate
    ],
)
def test_a_batch_or_pipeline_is_alarming_when_all_or_more_than_the_share_is_rejected(
    read: int, rejects: int, warn_above: float, alarming: bool
) -> None:
    assert RejectRate(read, rejects).alarming(warn_above) is alarming


def test_the_rate_is_said_with_its_counts_and_a_small_share_is_never_zero() -> None:
    assert RejectRate(8000, 8000).describe() == "8,000 of 8,000 records rejected (100%)"
    assert RejectRate(2003, 33).describe() == "33 of 2,003 records rejected (2%)"
    assert RejectRate(1000, 4).describe() == "4 of 1,000 records rejected (0.4%)"
    assert RejectRate(0, 0, batches=0).describe() == "0 of 0 records rejected (0%)"


def test_the_most_common_reason_is_counted() -> None:
    reasons = ["malformed JSON", "missing field: id", None, "malformed JSON", "missing field: id", "malformed JSON"]
    assert most_common_reason(reasons) == CommonReason("malformed JSON", 3)
    assert most_common_reason([None, None]) is None
    assert most_common_reason([]) is None


@pytest.mark.parametrize(("raw", "share"), [("", DEFAULT_REJECT_RATE_WARN), ("0.2", 0.2), ("20%", 0.2), ("1", 1.0)])
def test_the_share_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str, share: float) -> None:
    monkeypatch.setenv(REJECT_RATE_ENV, raw)
    assert reject_rate_warn() == pytest.approx(share)


@pytest.mark.parametrize("raw", ["lots", "1.5", "-0.1", "150%"])
def test_a_setting_that_is_not_a_share_is_one_error_naming_it(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(REJECT_RATE_ENV, raw)
    with pytest.raises(ConfigError) as caught:
        reject_rate_warn()
    assert str(caught.value) == (
        f"KRISHIV_REJECT_RATE_WARN: expected a share from 0 to 1 (such as 0.5, or 50%), got {raw!r}"
    )
