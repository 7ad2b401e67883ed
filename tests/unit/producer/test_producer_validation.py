"""Records are checked at put time: bad keys and sizes fail at once, with typed errors."""

from __future__ import annotations

import pytest

from shardflow.errors import (
    InvalidExplicitHashKeyError,
    InvalidPartitionKeyError,
    RecordTooLargeError,
)
from shardflow.producer.settings import ProducerSettings
from shardflow.producer.validation import prepare, prepare_input
from shardflow.shards import MAX_HASH_KEY, partition_key_hash

LIMIT = 1024 * 1024


@pytest.mark.parametrize("key", ["", "k" * 257])
def test_empty_or_long_partition_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidPartitionKeyError):
        prepare(b"data", key, None, LIMIT)


def test_a_partition_key_must_be_text() -> None:
    with pytest.raises(InvalidPartitionKeyError, match="must be a str"):
        prepare(b"data", 42, None, LIMIT)  # type: ignore[arg-type]
    with pytest.raises(InvalidPartitionKeyError, match="Unicode"):
        prepare(b"data", "\udcff", None, LIMIT)


def test_a_256_character_key_is_fine_and_hashed_like_kinesis() -> None:
    key = "é" * 256  # 256 characters, 512 UTF-8 bytes
    data, size, hash_key = prepare(b"abc", key, None, LIMIT)
    assert data == b"abc"
    assert size == 3 + 512
    assert hash_key == partition_key_hash(key)


def test_size_counts_data_plus_utf8_key_against_the_limit() -> None:
    prepare(b"x" * (LIMIT - 3), "abc", None, LIMIT)
    with pytest.raises(RecordTooLargeError) as caught:
        prepare(b"x" * (LIMIT - 2), "abc", None, LIMIT)
    assert caught.value.size == LIMIT + 1
    assert caught.value.limit == LIMIT


def test_text_data_is_sent_utf8_and_buffers_are_copied() -> None:
    assert prepare("naïve", "k", None, LIMIT)[0] == "naïve".encode()
    assert prepare(bytearray(b"ab"), "k", None, LIMIT)[0] == b"ab"
    with pytest.raises(TypeError):
        prepare(12, "k", None, LIMIT)  # type: ignore[arg-type]


@pytest.mark.parametrize("explicit", ["0", "42", str(MAX_HASH_KEY)])
def test_explicit_hash_keys_place_the_record(explicit: str) -> None:
    assert prepare(b"", "k", explicit, LIMIT)[2] == int(explicit)


@pytest.mark.parametrize("explicit", ["", "-1", "1.5", "abc", str(MAX_HASH_KEY + 1), "١٢"])
def test_bad_explicit_hash_keys_are_refused(explicit: str) -> None:
    with pytest.raises(InvalidExplicitHashKeyError):
        prepare(b"", "k", explicit, LIMIT)


def test_prepare_input_takes_two_or_three_fields() -> None:
    assert prepare_input((b"a", "k"), LIMIT)[3:] == ("k", None)
    assert prepare_input((b"a", "k", "7"), LIMIT)[2:] == (7, "k", "7")


@pytest.mark.parametrize(
    "options",
    [
        {"max_request_records": 501},
        {"max_request_records": 0},
        {"aggregation_max_bytes": 2 * 1024 * 1024},
        {"linger": -1},
        {"shard_records_per_second": 0},
        {"throttle_decrease": 1.5},
        {"buffer_max_bytes": 10},
    ],
)
def test_invalid_settings_are_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        ProducerSettings(**options)  # type: ignore[arg-type]


def test_key_order_allows_one_request_per_shard_in_flight() -> None:
    assert ProducerSettings(max_in_flight_per_shard=5).shard_concurrency == 5
    assert (
        ProducerSettings(preserve_key_order=True, max_in_flight_per_shard=5).shard_concurrency == 1
    )
