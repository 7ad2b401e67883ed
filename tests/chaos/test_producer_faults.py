"""The producer under injected faults: every accepted record is delivered, as accepted.

A fault proxy between the producer and moto injects what Kinesis does under load and what
networks do: throttled and failed PutRecords entries (which are really not written), 500/503
answers, throttling of whole requests, read timeouts and dropped connections. Afterwards the
stream is read back directly from moto with boto3, aggregates are unpacked with
``shardflow.aggregation.deaggregate``, and what was read is compared with what was put:

- faults that never forward the request: exactly once, at the position PutResult reported;
- with ``preserve_key_order``: in addition, each key's records in the order they were put;
- faults after forwarding (the write happened, the client saw an error): at least once, the
  duplicates counted and explained by the injections.

Faults are injected with seeded probabilities, bounded in number; the producer keeps writing
waves of records until every planned fault has happened, so each test really meets all of them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from shardflow.aws import AwsSettings, Backoff
from shardflow.producer import Producer, ProducerSettings, PutResult
from shardflow.testing.faults import (
    INTERNAL_FAILURE,
    THROTTLED,
    Delay,
    Drop,
    ErrorResponse,
    Fault,
    FaultProxy,
    PartialFailure,
)
from support.boto import make_stream, user_records

pytestmark = pytest.mark.integration

READ_TIMEOUT = 0.3
TIMEOUT_DELAY = 0.8  # > READ_TIMEOUT: the client gives up first
KEYS = [f"customer-{n}" for n in range(12)]
WAVE = 60
MAX_WAVES = 25

# (fault, how often) — none of these forwards the request to moto.
NOT_FORWARDING: list[tuple[Fault, int]] = [
    (PartialFailure(fraction=0.3), 3),
    (PartialFailure(fraction=0.5, code=INTERNAL_FAILURE), 2),
    (ErrorResponse(INTERNAL_FAILURE), 1),
    (ErrorResponse("ServiceUnavailable"), 1),
    (ErrorResponse(THROTTLED), 1),
    (Delay(TIMEOUT_DELAY), 1),
    (Drop(), 1),
    (Drop(reset=True), 1),
]
# The write happens, the producer is told it failed: it must send again.
AFTER_FORWARDING: list[tuple[Fault, int]] = [
    (ErrorResponse(INTERNAL_FAILURE, after_forwarding=True), 2),
    (Drop(after_forwarding=True), 1),
    (Delay(TIMEOUT_DELAY, after_forwarding=True), 1),
]


@dataclass(frozen=True)
class ReadRecord:
    partition_key: str
    data: bytes
    shard_id: str
    sequence_number: str
    sub_sequence_number: int

    @property
    def position(self) -> tuple[str, str, int]:
        return (self.shard_id, self.sequence_number, self.sub_sequence_number)


@pytest.fixture
def stream(moto_url: str, stream_name: str) -> str:
    make_stream(moto_url, stream_name, 3)
    return stream_name


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url, seed=20240611) as proxy:
        yield proxy


def _settings(*, aggregate: bool, preserve_key_order: bool = False) -> ProducerSettings:
    return ProducerSettings(
        linger=0.005,
        # Small requests and aggregates: many entries, many chances for faults.
        max_request_records=20,
        aggregate=aggregate,
        aggregation_max_bytes=600,
        preserve_key_order=preserve_key_order,
        # Pacing far above moto's speed: this is about correctness, not throughput.
        shard_records_per_second=100_000,
        shard_bytes_per_second=100 * 1024 * 1024,
        retry=Backoff(base=0.005, cap=0.05, max_attempts=None),
        record_ttl=None,
        request_timeout=5.0,
    )


def _plan(proxy: FaultProxy, faults: list[tuple[Fault, int]]) -> list[tuple[int, int]]:
    """Add the faults (each fires with probability 0.4, a bounded number of times)."""
    return [
        (proxy.add(fault, operation="PutRecords", times=times, probability=0.4), times)
        for fault, times in faults
    ]


async def _produce_through(
    proxy: FaultProxy, stream: str, settings: ProducerSettings, rules: list[tuple[int, int]]
) -> list[tuple[str, bytes, PutResult]]:
    """Write waves of records until every rule fired as often as planned; what was put."""
    written: list[tuple[str, bytes, PutResult]] = []
    aws = AwsSettings(endpoint_url=proxy.url, read_timeout=READ_TIMEOUT, connect_timeout=1.0)
    async with Producer(stream, settings=settings, aws=aws) as producer:
        for wave in range(MAX_WAVES):
            futures = []
            for n in range(WAVE):
                key = KEYS[n % len(KEYS)]
                data = f"{key}|{wave:03d}-{n:03d}|".encode().ljust(40, b".")
                futures.append((key, data, await producer.put(data, key)))
            await producer.flush()
            written += [(key, data, future.result()) for key, data, future in futures]
            if all(proxy.injected_count(rule) == times for rule, times in rules):
                break
    await proxy.idle()
    for rule, times in rules:
        assert proxy.injected_count(rule) == times, "a planned fault never happened"
    return written


def _read_back(moto_url: str, stream: str) -> list[ReadRecord]:
    """Every user record in the stream, in stream order (shard, sequence, sub-sequence)."""
    return [
        ReadRecord(
            user.partition_key,
            user.data,
            user.shard_id,
            user.sequence_number,
            user.sub_sequence_number,
        )
        for user in user_records(moto_url, stream)
    ]


def _aggregated_share(read: list[ReadRecord]) -> float:
    per_record = Counter((r.shard_id, r.sequence_number) for r in read)
    return sum(1 for r in read if per_record[(r.shard_id, r.sequence_number)] > 1) / len(read)


@pytest.mark.parametrize("aggregate", [False, True], ids=["plain", "aggregated"])
async def test_every_record_delivered_exactly_once(
    aggregate: bool, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    rules = _plan(proxy, NOT_FORWARDING)
    written = await _produce_through(proxy, stream, _settings(aggregate=aggregate), rules)
    read = _read_back(moto_url, stream)

    assert Counter(r.data for r in read) == Counter(data for _, data, _ in written)
    assert all(count == 1 for count in Counter(r.data for r in read).values())
    # Each record is where its PutResult says, under its own key.
    by_data = {r.data: r for r in read}
    for key, data, result in written:
        landed = by_data[data]
        assert landed.partition_key == key
        assert landed.position == (
            result.shard_id,
            result.sequence_number,
            result.sub_sequence_number,
        )
        assert result.aggregated is aggregate
    assert any(result.attempts > 1 for _, _, result in written)
    # Entries failed by the proxy were really not written (else duplicates above), and the
    # timeouts were timeouts: the client had hung up before the delay ended.
    assert all(not i.forwarded for i in proxy.injected(kind="delay"))
    assert all(i.client_gone for i in proxy.injected(kind="delay"))
    if aggregate:
        assert _aggregated_share(read) > 0.9


@pytest.mark.parametrize("aggregate", [False, True], ids=["plain", "aggregated"])
async def test_key_order_is_kept_through_faults(
    aggregate: bool, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    rules = _plan(proxy, NOT_FORWARDING)
    settings = _settings(aggregate=aggregate, preserve_key_order=True)
    written = await _produce_through(proxy, stream, settings, rules)
    read = _read_back(moto_url, stream)

    put_order: dict[str, list[bytes]] = defaultdict(list)
    for key, data, _ in written:
        put_order[key].append(data)
    read_order: dict[str, list[bytes]] = defaultdict(list)
    for record in read:  # stream order within each shard; a key lives on one shard
        read_order[record.partition_key].append(record.data)
    assert set(read_order) == set(KEYS)
    for key in KEYS:
        assert read_order[key] == put_order[key], f"records of {key} out of order"
    assert any(result.attempts > 1 for _, _, result in written)


@pytest.mark.parametrize("aggregate", [False, True], ids=["plain", "aggregated"])
async def test_ambiguous_failures_deliver_at_least_once(
    aggregate: bool, proxy: FaultProxy, stream: str, moto_url: str
) -> None:
    rules = _plan(proxy, AFTER_FORWARDING)
    written = await _produce_through(proxy, stream, _settings(aggregate=aggregate), rules)
    read = _read_back(moto_url, stream)

    copies = Counter(r.data for r in read)
    assert set(copies) == {data for _, data, _ in written}
    duplicates = sum(count - 1 for count in copies.values())
    ambiguous = [i for i in proxy.injections if i.forwarded]
    assert len(ambiguous) == sum(times for _, times in AFTER_FORWARDING)
    # Each ambiguous request was written once more than the producer was told: every entry
    # in it (a plain record, or an aggregate of several) shows up twice.
    written_twice = sum(i.entries for i in ambiguous)
    if aggregate:
        assert duplicates >= written_twice
    else:
        assert duplicates == written_twice
    # A record's PutResult names one of the positions where a copy of it was read.
    positions: dict[bytes, set[tuple[str, str, int]]] = defaultdict(set)
    for record in read:
        positions[record.data].add(record.position)
    for _, data, result in written:
        reported = (result.shard_id, result.sequence_number, result.sub_sequence_number)
        assert reported in positions[data]
    print(f"{len(written)} records, {duplicates} duplicates from {len(ambiguous)} faults")
