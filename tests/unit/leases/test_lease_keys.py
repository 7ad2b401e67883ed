"""Lease keys: single-stream (shard id) and multi-stream (``account:stream:epoch:shard``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardflow.leases import (
    StreamIdentifier,
    is_multi_stream_lease_key,
    multi_stream_lease_key,
    split_multi_stream_lease_key,
)

stream_names = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"),
    min_size=1,
    max_size=128,
)
identifiers = st.builds(
    StreamIdentifier,
    st.integers(0, 10**12 - 1).map(lambda a: f"{a:012d}"),
    stream_names,
    st.integers(0, 2**40),
)
shard_ids = st.integers(0, 10**12 - 1).map(lambda i: f"shardId-{i:012d}")


@given(identifiers, shard_ids)
def test_multi_stream_keys_round_trip(stream: StreamIdentifier, shard_id: str) -> None:
    key = multi_stream_lease_key(stream, shard_id)
    assert key == f"{stream.account_id}:{stream.stream_name}:{stream.creation_epoch}:{shard_id}"
    assert split_multi_stream_lease_key(key) == (str(stream), shard_id)
    assert StreamIdentifier.parse(str(stream)) == stream
    assert is_multi_stream_lease_key(key)
    assert not is_multi_stream_lease_key(shard_id)


def test_serialized_identifiers_are_accepted_as_strings() -> None:
    key = multi_stream_lease_key("123456789012:orders:1700000000", "shardId-000000000007")
    assert key == "123456789012:orders:1700000000:shardId-000000000007"


@pytest.mark.parametrize(
    "bad",
    ["orders", "123:orders", "abc:orders:1", "123::1", "123:orders:x", "1:a:b:c"],
)
def test_malformed_stream_identifiers_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="stream identifier"):
        StreamIdentifier.parse(bad)


@pytest.mark.parametrize(
    "key", ["shardId-000000000000", "orders:shardId-0", "1:orders:2:", "x:orders:2:shardId-1"]
)
def test_other_keys_are_not_multi_stream(key: str) -> None:
    assert not is_multi_stream_lease_key(key)
    with pytest.raises(ValueError, match=r"multi-stream lease key|stream identifier"):
        split_multi_stream_lease_key(key)


def test_shard_ids_with_colons_are_refused() -> None:
    with pytest.raises(ValueError, match="shard id"):
        multi_stream_lease_key("1:orders:2", "a:b")
    with pytest.raises(ValueError, match="stream name"):
        StreamIdentifier("1", "a:b", 2)
