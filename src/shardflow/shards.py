"""Shards as data: hash-key ranges, the map from hash key to shard, parent/child lineage."""

from __future__ import annotations

import bisect
import hashlib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

MAX_HASH_KEY: Final = 2**128 - 1


def _md5_for_short_input() -> Callable[[bytes], Any]:
    # CPython's own MD5: for a key of a few bytes it costs a third of OpenSSL's (whose
    # per-call set-up dominates at that size), and producers hash every record's key.
    try:
        return importlib.import_module("_md5").md5  # type: ignore[no-any-return]
    except ImportError:  # an interpreter built without it
        return hashlib.md5


_short_md5 = _md5_for_short_input()


def key_bytes_hash(key_bytes: bytes) -> int:
    """Kinesis' hash of a partition key's UTF-8 bytes: their MD5 as an unsigned 128-bit integer.

    (MD5 here places records on shards; it protects nothing.)
    """
    return int.from_bytes(_short_md5(key_bytes).digest(), "big")


def partition_key_hash(partition_key: str) -> int:
    """Kinesis' hash of a partition key: MD5 of its UTF-8 bytes as an unsigned 128-bit integer."""
    return key_bytes_hash(partition_key.encode("utf-8"))


def hash_key_of(partition_key: str, explicit_hash_key: str | None = None) -> int:
    """The hash key that places a record: the explicit hash key if given, else the MD5 hash."""
    if explicit_hash_key is not None:
        return int(explicit_hash_key)
    return partition_key_hash(partition_key)


@dataclass(frozen=True, slots=True)
class HashKeyRange:
    start: int
    end: int  # inclusive

    def __contains__(self, hash_key: object) -> bool:
        return isinstance(hash_key, int) and self.start <= hash_key <= self.end


@dataclass(frozen=True, slots=True)
class ChildShard:
    """A shard created from a closed one, as GetRecords' ``ChildShards`` reports it."""

    shard_id: str
    parent_shard_ids: tuple[str, ...]
    hash_range: HashKeyRange | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> ChildShard:
        hash_range = raw.get("HashKeyRange")
        return cls(
            shard_id=raw["ShardId"],
            parent_shard_ids=tuple(raw.get("ParentShards", ())),
            hash_range=(
                HashKeyRange(int(hash_range["StartingHashKey"]), int(hash_range["EndingHashKey"]))
                if hash_range
                else None
            ),
        )


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as ListShards describes it."""

    shard_id: str
    hash_range: HashKeyRange
    parent_shard_id: str | None = None
    adjacent_parent_shard_id: str | None = None
    starting_sequence_number: str | None = None
    ending_sequence_number: str | None = None  # set once the shard is closed

    @property
    def is_open(self) -> bool:
        return self.ending_sequence_number is None

    @property
    def parent_ids(self) -> tuple[str, ...]:
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)

    @classmethod
    def from_api(cls, shard: Mapping[str, Any]) -> ShardInfo:
        """Build from one element of ListShards' ``Shards`` (or DescribeStream's)."""
        hash_range = shard["HashKeyRange"]
        seq_range = shard.get("SequenceNumberRange", {})
        return cls(
            shard_id=shard["ShardId"],
            hash_range=HashKeyRange(
                int(hash_range["StartingHashKey"]), int(hash_range["EndingHashKey"])
            ),
            parent_shard_id=shard.get("ParentShardId"),
            adjacent_parent_shard_id=shard.get("AdjacentParentShardId"),
            starting_sequence_number=seq_range.get("StartingSequenceNumber"),
            ending_sequence_number=seq_range.get("EndingSequenceNumber"),
        )


class ShardMap:
    """Finds the open shard that owns a hash key (binary search over sorted ranges).

    Built from open shards only: closed shards accept no writes. If the ranges have a gap (a
    listing taken mid-reshard) ``shard_for`` returns None and the caller should refresh.
    """

    def __init__(self, shards: Iterable[ShardInfo]) -> None:
        open_shards = sorted((s for s in shards if s.is_open), key=lambda s: s.hash_range.start)
        self._shards = open_shards
        self._starts = [s.hash_range.start for s in open_shards]

    @property
    def shards(self) -> list[ShardInfo]:
        return list(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    def shard_for(self, hash_key: int) -> ShardInfo | None:
        i = bisect.bisect_right(self._starts, hash_key) - 1
        if i < 0:
            return None
        shard = self._shards[i]
        return shard if hash_key in shard.hash_range else None

    def shard_for_key(
        self, partition_key: str, explicit_hash_key: str | None = None
    ) -> ShardInfo | None:
        return self.shard_for(hash_key_of(partition_key, explicit_hash_key))
