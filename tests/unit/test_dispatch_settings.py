"""DispatchSettings and the retry backoff: defaults, validation, pauses."""

from __future__ import annotations

import random

import pytest

from shardflow.consumer.dispatch import DispatchSettings, RetryBackoff, RetryPolicy
from shardflow.records import Record


def test_defaults_keep_shard_order_and_stop_the_shard() -> None:
    settings = DispatchSettings()
    assert settings.ordering == "shard"
    assert settings.on_failure == "stop-shard"
    assert not settings.needs_dead_letters
    assert settings.key_function(Record(b"", "customer-7", "1")) == "customer-7"


def test_a_key_function_replaces_the_partition_key() -> None:
    settings = DispatchSettings(ordering="key", key=lambda record: record.data.decode())
    assert settings.key_function(Record(b"c-9", "pk", "1")) == "c-9"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ordering": "by-key"}, "ordering"),
        ({"on_failure": "ignore"}, "on_failure"),
        ({"max_in_flight_per_shard": 0}, "max_in_flight_per_shard"),
    ],
)
def test_invalid_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DispatchSettings(**kwargs)  # type: ignore[arg-type]


def test_invalid_retry_and_backoff_are_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="multiplier"):
        RetryBackoff(multiplier=0.5)
    with pytest.raises(ValueError, match="negative"):
        RetryBackoff(initial=-1)
    with pytest.raises(TypeError):
        DispatchSettings(key="customer_id")  # type: ignore[arg-type]


def test_backoff_grows_to_its_cap() -> None:
    backoff = RetryBackoff(initial=0.1, maximum=1.0, multiplier=3.0, jitter=False)
    assert [backoff.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.3, 0.9, 1.0])


def test_jitter_stays_in_the_upper_half() -> None:
    backoff = RetryBackoff(initial=0.4, maximum=10.0)
    rng = random.Random(7)
    delays = [backoff.delay(2, rng) for _ in range(200)]
    assert all(0.4 <= d <= 0.8 for d in delays)
    assert len(set(delays)) > 1


def test_the_per_worker_bound_is_positive_when_given() -> None:
    assert DispatchSettings(max_in_flight_per_worker=4).max_in_flight_per_worker == 4
    with pytest.raises(ValueError, match="max_in_flight_per_worker"):
        DispatchSettings(max_in_flight_per_worker=0)
