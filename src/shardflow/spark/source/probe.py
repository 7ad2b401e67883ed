"""Driver-side check whether a shard has anything to read past a position, without reading it.

One GetShardIterator and one GetRecords with Limit=1 per shard: enough to decide whether a
micro-batch is worth planning. The record it may return is not handed on: the data itself is
only ever read by executor tasks.

A probe that found a shard caught up keeps the iterator its GetRecords returned
(:class:`ProbeIterators`): while the shard stays at that position (nothing new, no batch read
it), the next probe asks GetRecords with it and skips GetShardIterator, which halves the calls
of an idle trigger (256 shards: 256 calls, not 512). An iterator is kept for 4 minutes (Kinesis
honours one for 5); an expired or refused one is replaced by a new one at once.

Under Trigger.AvailableNow with no row limit a probe may stop early (:func:`probe_or_sample`):
when most of a first sample of shards has records, the stream is busy and the batch reads every
readable shard without probing the rest. A task reading a shard that turns out to hold nothing
pays the same two calls the probe would have paid on the driver, and the driver's sweep (most
of the planning of a 256-shard batch: 0.3-0.5 s of about 0.6 s) goes; a sparse stream is probed whole as before,
so a batch never reads many shards for a few records. The batch still holds records (the
sample found some), so no batch is ever planned for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardflow.aws.backoff import retrying
from shardflow.aws.kinesis import arn_ref, stream_ref
from shardflow.backoff import Backoff
from shardflow.errors import ExpiredIteratorError, InvalidArgumentError
from shardflow.spark.source.positions import Kind, ShardPosition

_PROBE_BACKOFF = Backoff(base=0.1, cap=2.0, max_attempts=6)

SAMPLE_SHARDS = 16
"""Shards probed first by :func:`probe_or_sample`: the rest go unprobed when at least half of
them have records."""

ITERATOR_KEPT_S = 240.0
"""How long a probe's iterator is used again (Kinesis honours a shard iterator for 5 minutes)."""


@dataclass(frozen=True, slots=True)
class _Kept:
    position: ShardPosition
    iterator: str
    since: float


class ProbeIterators:
    """Per shard, the iterator its last probe ended at, while the shard stands where it did."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: dict[str, _Kept] = {}

    def take(self, shard_id: str, position: ShardPosition) -> str | None:
        """The kept iterator of ``shard_id`` at ``position`` (removed: a probe keeps the next)."""
        kept = self._kept.pop(shard_id, None)
        if kept is None or kept.position != position:
            return None
        if self._clock() - kept.since >= ITERATOR_KEPT_S:
            return None
        return kept.iterator

    def keep(self, shard_id: str, position: ShardPosition, iterator: str) -> None:
        self._kept[shard_id] = _Kept(position, iterator, self._clock())

    def keep_only(self, shard_ids: Iterable[str]) -> None:
        """Forget the shards not in ``shard_ids`` (gone from the stream, or read to their end)."""
        wanted = set(shard_ids)
        for shard_id in [s for s in self._kept if s not in wanted]:
            del self._kept[shard_id]

    def __len__(self) -> int:
        return len(self._kept)


async def has_records(
    kinesis: Any,
    stream: str,
    shard_id: str,
    position: ShardPosition,
    cutoff_ms: int | None,
    iterators: ProbeIterators | None = None,
) -> bool:
    """Whether a batch reading ``shard_id`` from ``position`` would find a record (one that
    arrived by ``cutoff_ms``, if given) or the shard's end. Unsure answers are yes."""
    if position.kind is Kind.SHARD_END:
        return False
    if position.kind is Kind.AFTER and position.sub_sequence_number is not None:
        return True  # the rest of an aggregate the last batch stopped inside
    kept = None if iterators is None else iterators.take(shard_id, position)
    page: Mapping[str, Any] | None = None
    try:
        if kept is not None:
            try:
                page = await _get_records(kinesis, stream, shard_id, kept)
            except (ExpiredIteratorError, InvalidArgumentError):
                page = None  # too old for the service after all: a new one below
        if page is None:
            iterator = await _iterator_at(kinesis, stream, shard_id, position)
            if iterator is None:
                return True
            page = await _get_records(kinesis, stream, shard_id, iterator)
    except InvalidArgumentError:
        return True  # a position the service no longer knows: the task reports the loss
    records = page.get("Records") or []
    if records:
        if cutoff_ms is None:
            return True
        arrived = records[0].get("ApproximateArrivalTimestamp")
        return arrived is None or arrived.timestamp() * 1000 <= cutoff_ms
    following = page.get("NextShardIterator")
    if following is None:
        return True  # the shard ended: a batch records that, which lets its children start
    if page.get("MillisBehindLatest"):
        return True
    if iterators is not None:
        # Caught up: the next probe of this shard at this position goes on from here.
        iterators.keep(shard_id, position, following)
    return False


async def _iterator_at(
    kinesis: Any, stream: str, shard_id: str, position: ShardPosition
) -> str | None:
    params: dict[str, Any] = {**stream_ref(stream), "ShardId": shard_id}
    if position.kind is Kind.AFTER:
        assert position.sequence_number is not None
        params.update(
            ShardIteratorType="AFTER_SEQUENCE_NUMBER",
            StartingSequenceNumber=position.sequence_number,
        )
    else:
        params.update(position.iterator_start().iterator_params())
    answer = await retrying(
        lambda: kinesis.get_shard_iterator(**params),
        operation="GetShardIterator",
        stream=stream,
        shard_id=shard_id,
        backoff=_PROBE_BACKOFF,
    )
    iterator: str | None = answer.get("ShardIterator")
    return iterator


async def _get_records(
    kinesis: Any, stream: str, shard_id: str, iterator: str
) -> Mapping[str, Any]:
    page: Mapping[str, Any] = await retrying(
        lambda: kinesis.get_records(ShardIterator=iterator, Limit=1, **arn_ref(stream)),
        operation="GetRecords",
        stream=stream,
        shard_id=shard_id,
        backoff=_PROBE_BACKOFF,
    )
    return page


async def shards_with_records(
    kinesis: Any,
    stream: str,
    positions: Mapping[str, ShardPosition],
    cutoff_ms: int | None,
    iterators: ProbeIterators | None = None,
) -> set[str]:
    """The shards among ``positions`` that :func:`has_records` says yes for, probed together."""
    if iterators is not None:
        iterators.keep_only(positions)
    return await _probe_each(kinesis, stream, positions, cutoff_ms, iterators)


@dataclass(frozen=True, slots=True)
class ProbeOutcome:
    """What planning learnt of the shards it was asked about: ``with_records`` (probed, a batch
    would find records), ``caught_up`` (probed, nothing to read), ``unprobed`` (left to the
    batch to read: the sample showed a busy stream)."""

    with_records: frozenset[str]
    caught_up: frozenset[str]
    unprobed: frozenset[str] = field(default_factory=frozenset)

    @property
    def to_read(self) -> frozenset[str]:
        return self.with_records | self.unprobed


async def probe_or_sample(
    kinesis: Any,
    stream: str,
    positions: Mapping[str, ShardPosition],
    cutoff_ms: int | None,
    iterators: ProbeIterators | None = None,
    *,
    sample: bool = False,
) -> ProbeOutcome:
    """Probe every shard of ``positions``; with ``sample``, probe the first
    :data:`SAMPLE_SHARDS` (in shard order) first and, if at least half of them have records,
    leave the rest unprobed (the batch reads them)."""
    shard_ids = sorted(positions)
    if not sample or len(shard_ids) <= SAMPLE_SHARDS:
        found = await shards_with_records(kinesis, stream, positions, cutoff_ms, iterators)
        return ProbeOutcome(frozenset(found), frozenset(shard_ids) - found)
    first = {s: positions[s] for s in shard_ids[:SAMPLE_SHARDS]}
    rest = {s: positions[s] for s in shard_ids[SAMPLE_SHARDS:]}
    if iterators is not None:
        iterators.keep_only(shard_ids)  # the sample's probe alone would forget the rest's
    found = await _probe_each(kinesis, stream, first, cutoff_ms, iterators)
    if 2 * len(found) >= len(first):
        return ProbeOutcome(frozenset(found), frozenset(first) - found, frozenset(rest))
    found |= await _probe_each(kinesis, stream, rest, cutoff_ms, iterators)
    return ProbeOutcome(frozenset(found), frozenset(shard_ids) - found)


async def _probe_each(
    kinesis: Any,
    stream: str,
    positions: Mapping[str, ShardPosition],
    cutoff_ms: int | None,
    iterators: ProbeIterators | None,
) -> set[str]:
    shard_ids = sorted(positions)
    answers = await asyncio.gather(
        *(has_records(kinesis, stream, s, positions[s], cutoff_ms, iterators) for s in shard_ids)
    )
    return {shard_id for shard_id, yes in zip(shard_ids, answers, strict=True) if yes}
