"""DispatchSettings and the retry backoff: defaults, validation, pauses."""

from __future__ import annotations

import pytest

from shardflow.consumer.delivery import DispatchSettings
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


def test_a_key_that_is_not_a_function_is_refused() -> None:
    with pytest.raises(TypeError):
        DispatchSettings(key="customer_id")  # type: ignore[arg-type]


def test_retries_default_to_three_calls_with_half_jitter() -> None:
    retry = DispatchSettings().retry
    assert (retry.max_attempts, retry.jitter) == (3, "half")
