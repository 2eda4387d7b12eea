"""One unit for durations across the public API: a timedelta or seconds; ms only in Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streamq import Backoff, ConfigurationError, ContractError, JobDefaults, Limiter, Retry
from streamq.durations import to_ms
from streamq.producer import delay_to_ms


@pytest.mark.parametrize(("value", "ms"), [
    (timedelta(seconds=1.5), 1500), (1.5, 1500), (30, 30_000), (0, 0), (0.0004, 0),
])
def test_a_duration_is_a_timedelta_or_seconds(value: timedelta | float, ms: int) -> None:
    assert to_ms(value, "x") == ms


@pytest.mark.parametrize("value", [True, "30", None, float("nan"), float("inf"), [1]])
def test_what_is_not_a_duration_is_refused_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigurationError, match="lock_duration"):
        to_ms(value, "lock_duration")  # type: ignore[arg-type]


def test_a_minimum_is_checked_and_named() -> None:
    with pytest.raises(ConfigurationError, match="timeout must be at least 1 ms"):
        to_ms(0, "timeout", minimum=1)
    with pytest.raises(ConfigurationError, match="delay must not be negative"):
        delay_to_ms(-1)


def test_every_public_duration_means_seconds() -> None:
    assert delay_to_ms(30) == 30_000
    assert delay_to_ms(None) == 0
    assert Retry(30).delay_ms == 30_000
    assert Retry(timedelta(minutes=1)).delay_ms == 60_000
    assert Retry(-5).delay_ms == 0  # a processor's arithmetic may overshoot: "now"
    assert Limiter(max_jobs=10, duration=2).duration_ms == 2000
    assert Backoff.fixed(3).delay_ms == 3000
    assert JobDefaults(dedup_window=90).dedup_window_ms == 90_000
    assert JobDefaults().dedup_window_ms == 3_600_000


def test_a_contract_dedup_window_below_a_millisecond_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="dedup_window"):
        JobDefaults(dedup_window=0)
