from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from shardflow.shards import (
    MAX_HASH_KEY,
    HashKeyRange,
    ShardInfo,
    ShardMap,
    hash_key_of,
    partition_key_hash,
)


def _even_shards(count: int) -> list[ShardInfo]:
    width = (MAX_HASH_KEY + 1) // count
    shards = []
    for i in range(count):
        end = MAX_HASH_KEY if i == count - 1 else (i + 1) * width - 1
        shards.append(ShardInfo(f"shardId-{i:012d}", HashKeyRange(i * width, end)))
    return shards


def test_partition_key_hash_is_md5_as_big_endian_integer() -> None:
    # Value computed independently: int(md5("customer-1").hexdigest(), 16).
    assert partition_key_hash("customer-1") == int(hashlib.md5(b"customer-1").hexdigest(), 16)
    assert hash_key_of("ignored", "12345") == 12345


@given(st.text(min_size=1, max_size=256))
def test_partition_key_hash_matches_hashlib_for_any_key(key: str) -> None:
    # shardflow hashes short keys with CPython's own MD5, not OpenSSL's: same digest.
    try:
        utf8 = key.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates: not a valid partition key (put rejects it)
    assert partition_key_hash(key) == int.from_bytes(hashlib.md5(utf8).digest(), "big")


@given(st.integers(1, 64), st.integers(0, MAX_HASH_KEY))
def test_every_hash_key_has_exactly_one_owner(count: int, hash_key: int) -> None:
    shards = _even_shards(count)
    owner = ShardMap(shards).shard_for(hash_key)
    assert owner is not None
    assert [s for s in shards if hash_key in s.hash_range] == [owner]


def test_closed_shards_are_not_in_the_map_and_gaps_return_none() -> None:
    closed = ShardInfo("shardId-0", HashKeyRange(0, MAX_HASH_KEY), ending_sequence_number="99")
    child = ShardInfo("shardId-1", HashKeyRange(0, MAX_HASH_KEY // 2), parent_shard_id="shardId-0")
    shard_map = ShardMap([closed, child])
    assert len(shard_map) == 1
    assert shard_map.shard_for(0) == child
    assert shard_map.shard_for(MAX_HASH_KEY) is None  # the other child was not listed yet


def test_shard_info_from_list_shards_response() -> None:
    raw = {
        "ShardId": "shardId-000000000003",
        "ParentShardId": "shardId-000000000001",
        "AdjacentParentShardId": "shardId-000000000002",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "100"},
        "SequenceNumberRange": {"StartingSequenceNumber": "4955"},
    }
    shard = ShardInfo.from_api(raw)
    assert shard.parent_ids == ("shardId-000000000001", "shardId-000000000002")
    assert shard.is_open
    assert 100 in shard.hash_range
    assert 101 not in shard.hash_range
