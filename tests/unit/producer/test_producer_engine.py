"""The producer's send loop against an in-memory Kinesis with scripted faults (no servers).

Real servers are exercised in tests/integration; here the point is logic that emulators never
trigger on their own: partial failures, retries, throttling, budgets, mispredicted shards.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shardflow.aggregation import deaggregate
from shardflow.aws import AwsSettings, Backoff, ClientFactory
from shardflow.errors import (
    AccessDeniedError,
    InvalidPartitionKeyError,
    ProducerClosedError,
    ProducerError,
    RecordDeliveryError,
    RecordTooLargeError,
    ResourceNotFoundError,
)
from shardflow.producer import Producer, ProducerMetricsSnapshot, ProducerSettings
from shardflow.records import Record
from shardflow.shards import MAX_HASH_KEY

THROTTLED = "ProvisionedThroughputExceededException"
FAST_RETRY = Backoff(base=0.001, cap=0.01)


def hash_of(entry: dict[str, Any]) -> int:
    if "ExplicitHashKey" in entry:
        return int(entry["ExplicitHashKey"])
    return int.from_bytes(hashlib.md5(entry["PartitionKey"].encode()).digest(), "big")


def even_shards(count: int, first_id: int = 0) -> list[tuple[str, int, int]]:
    step = (MAX_HASH_KEY + 1) // count
    return [
        (
            f"shardId-{first_id + i:012d}",
            i * step,
            MAX_HASH_KEY if i == count - 1 else (i + 1) * step - 1,
        )
        for i in range(count)
    ]


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"injected {code}"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "PutRecords",
    )


class FakeKinesis:
    """Writes records to in-memory shards by hash key; faults come from the two hooks."""

    def __init__(self, shard_count: int = 2, stream: str = "s") -> None:
        self.stream = stream
        self.open_shards = even_shards(shard_count)
        self.closed_shards: list[tuple[str, int, int]] = []
        self.written: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.calls = 0
        self.in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight: dict[str, int] = defaultdict(int)
        self.call_fault: Callable[[int], Exception | None] = lambda call: None
        self.entry_fault: Callable[[int, dict[str, Any]], str | None] = lambda call, e: None
        self.latency = 0.0
        self.gate: asyncio.Event | None = None

    def shard_for(self, hash_key: int) -> str:
        for shard_id, start, end in self.open_shards:
            if start <= hash_key <= end:
                return shard_id
        raise AssertionError("no shard")

    def split_first_shard(self) -> None:
        shard_id, start, end = self.open_shards[0]
        middle = (start + end) // 2
        next_id = 1 + max(int(s[0][-12:]) for s in [*self.open_shards, *self.closed_shards])
        self.closed_shards.append((shard_id, start, end))
        self.open_shards = [
            (f"shardId-{next_id:012d}", start, middle),
            (f"shardId-{next_id + 1:012d}", middle + 1, end),
            *self.open_shards[1:],
        ]

    async def list_shards(self, **params: Any) -> dict[str, Any]:
        if params.get("StreamName", self.stream) != self.stream:
            raise ClientError(
                {"Error": {"Code": "ResourceNotFoundException", "Message": "no such stream"}},
                "ListShards",
            )
        shards = [
            {
                "ShardId": shard_id,
                "HashKeyRange": {"StartingHashKey": str(start), "EndingHashKey": str(end)},
                "SequenceNumberRange": {"StartingSequenceNumber": "0"},
            }
            for shard_id, start, end in self.open_shards
        ]
        shards += [
            {
                "ShardId": shard_id,
                "HashKeyRange": {"StartingHashKey": str(start), "EndingHashKey": str(end)},
                "SequenceNumberRange": {"StartingSequenceNumber": "0", "EndingSequenceNumber": "9"},
            }
            for shard_id, start, end in self.closed_shards
        ]
        return {"Shards": shards}

    async def put_records(self, *, Records: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        self.calls += 1
        call = self.calls
        touched = {self.shard_for(hash_of(entry)) for entry in Records}
        for shard_id in touched:
            self.in_flight[shard_id] += 1
            self.max_in_flight[shard_id] = max(
                self.max_in_flight[shard_id], self.in_flight[shard_id]
            )
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.latency)
            error = self.call_fault(call)
            if error is not None:
                raise error
            results = []
            for entry in Records:
                code = self.entry_fault(call, entry)
                if code:
                    results.append({"ErrorCode": code, "ErrorMessage": f"injected {code}"})
                    continue
                shard_id = self.shard_for(hash_of(entry))
                self.written[shard_id].append(entry)
                results.append(
                    {"ShardId": shard_id, "SequenceNumber": str(len(self.written[shard_id]))}
                )
            failed = sum("ErrorCode" in r for r in results)
            return {"FailedRecordCount": failed, "Records": results}
        finally:
            for shard_id in touched:
                self.in_flight[shard_id] -= 1

    def user_records(self) -> dict[str, list[Record]]:
        """What a consumer would read, per shard, aggregates unpacked."""
        out: dict[str, list[Record]] = {}
        for shard_id, entries in self.written.items():
            records: list[Record] = []
            for i, entry in enumerate(entries):
                records.extend(
                    deaggregate(
                        Record(
                            data=entry["Data"],
                            partition_key=entry["PartitionKey"],
                            sequence_number=str(i + 1),
                            explicit_hash_key=entry.get("ExplicitHashKey"),
                            shard_id=shard_id,
                        )
                    )
                )
            out[shard_id] = records
        return out


class FakeClients(ClientFactory):
    def __init__(self, kinesis: FakeKinesis) -> None:
        super().__init__(AwsSettings())
        self.fake = kinesis

    def kinesis(self, **config_overrides: Any) -> Any:
        @asynccontextmanager
        async def client() -> AsyncIterator[FakeKinesis]:
            yield self.fake

        return client()


def settings(**overrides: Any) -> ProducerSettings:
    """Quick producer settings; ``max_attempts`` (default 10) and ``backoff`` make its retry."""
    retry = replace(
        overrides.pop("backoff", FAST_RETRY), max_attempts=overrides.pop("max_attempts", 10)
    )
    options: dict[str, Any] = {"linger": 0.005, "retry": retry}
    options.update(overrides)
    return ProducerSettings(**options)


def producer_for(fake: FakeKinesis, **overrides: Any) -> Producer:
    return Producer(fake.stream, settings=settings(**overrides), clients=FakeClients(fake))


def sequence_of(data: bytes) -> int:
    return int(data.split(b"|")[0])


async def put_numbered(producer: Producer, count: int, keys: int) -> list[asyncio.Future[Any]]:
    return [await producer.put(f"{i}|payload".encode(), f"key-{i % keys}") for i in range(count)]


def assert_key_order(fake: FakeKinesis, count: int) -> None:
    """Every record once, and each key's records in the order they were put."""
    per_key: dict[str, list[int]] = defaultdict(list)
    for records in fake.user_records().values():
        for record in records:
            per_key[record.partition_key].append(sequence_of(record.data))
    every = sorted(n for numbers in per_key.values() for n in numbers)
    assert every == list(range(count))
    for key, numbers in per_key.items():
        assert numbers == sorted(numbers), f"records of {key} out of order"


@pytest.mark.parametrize("aggregate", [False, True])
async def test_partial_failures_are_retried_and_every_key_keeps_its_order(aggregate: bool) -> None:
    fake = FakeKinesis(shard_count=3)
    rng = random.Random(7)
    # A quarter of the entries fail; a few of those as throttled (each halves a shard's pace).
    fake.entry_fault = lambda call, entry: (
        rng.choice([THROTTLED] + ["InternalFailure"] * 9) if rng.random() < 0.25 else None
    )
    fake.latency = 0.002
    async with producer_for(
        fake,
        preserve_key_order=True,
        aggregate=aggregate,
        max_attempts=None,
        shard_records_per_second=50_000,  # throttles slow it down, but not the test
    ) as producer:
        futures = await put_numbered(producer, 1_000, keys=40)
        results = await asyncio.gather(*futures)
        snapshot = producer.metrics()
    assert_key_order(fake, 1_000)
    assert max(fake.max_in_flight.values()) == 1  # one request per shard at a time
    assert any(r.attempts > 1 for r in results)
    assert snapshot.records_succeeded == 1_000
    assert snapshot.retries > 0
    assert snapshot.entries_throttled > 0
    assert all(result.sequence_number for result in results)
    assert any(result.aggregated for result in results) == aggregate


async def test_without_key_order_several_requests_per_shard_fly_at_once() -> None:
    fake = FakeKinesis(shard_count=1)
    fake.latency = 0.05
    async with producer_for(
        fake, max_request_records=10, max_in_flight_per_shard=4, linger=0.0
    ) as producer:
        await asyncio.gather(*await put_numbered(producer, 200, keys=7))
    assert fake.max_in_flight["shardId-000000000000"] == 4


async def test_whole_call_failures_that_may_pass_are_retried() -> None:
    fake = FakeKinesis()
    fake.call_fault = lambda call: client_error("ServiceUnavailable", 503) if call <= 2 else None
    async with producer_for(fake) as producer:
        future = await producer.put(b"x", "k")
        result = await future
    assert result.attempts == 3
    assert fake.calls == 3


async def test_timeouts_and_dropped_connections_are_retried() -> None:
    fake = FakeKinesis()
    errors = [ConnectionResetError("reset by peer"), TimeoutError()]
    fake.call_fault = lambda call: errors[call - 1] if call <= len(errors) else None
    async with producer_for(fake) as producer:
        result = await (await producer.put(b"x", "k"))
    assert result.attempts == 3


async def test_a_hung_call_is_cut_by_the_request_timeout_and_retried() -> None:
    fake = FakeKinesis()
    original = fake.put_records

    async def hang_once(**kwargs: Any) -> dict[str, Any]:
        if fake.calls == 0:
            fake.calls += 1
            await asyncio.sleep(60)
        return await original(**kwargs)

    fake.put_records = hang_once  # type: ignore[method-assign]
    async with producer_for(fake, request_timeout=0.1) as producer:
        result = await asyncio.wait_for(await producer.put(b"x", "k"), 5)
    assert result.attempts == 2


async def test_non_retryable_errors_fail_the_records_at_once() -> None:
    fake = FakeKinesis()
    fake.call_fault = lambda call: client_error("AccessDeniedException", 400)
    started = time.monotonic()
    async with producer_for(fake, max_attempts=None, record_ttl=None) as producer:
        futures = await put_numbered(producer, 20, keys=3)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        snapshot = producer.metrics()
    assert time.monotonic() - started < 2
    for outcome in outcomes:
        assert isinstance(outcome, RecordDeliveryError)
        assert outcome.code == "AccessDeniedException"
        assert outcome.attempts == 1
        assert isinstance(outcome.__cause__, AccessDeniedError)
        assert outcome.stream == "s"
    assert snapshot.records_failed == 20
    assert snapshot.failures == {"AccessDeniedException": 20}


async def test_records_fail_once_the_attempt_budget_is_spent() -> None:
    fake = FakeKinesis()
    fake.entry_fault = lambda call, entry: THROTTLED
    async with producer_for(fake, max_attempts=3) as producer:
        future = await producer.put(b"x", "k")
        with pytest.raises(RecordDeliveryError) as caught:
            await future
        snapshot = producer.metrics()
    assert caught.value.code == THROTTLED
    assert caught.value.attempts == 3
    assert snapshot.entries_throttled == 3
    assert snapshot.percentile("attempts", 100) == 3


async def test_records_fail_once_their_deadline_passed() -> None:
    fake = FakeKinesis()
    fake.entry_fault = lambda call, entry: "InternalFailure"
    async with producer_for(
        fake, max_attempts=None, record_ttl=0.2, backoff=Backoff(base=0.05, cap=0.05)
    ) as producer:
        started = time.monotonic()
        with pytest.raises(RecordDeliveryError) as caught:
            await (await producer.put(b"x", "k"))
    assert 0.2 <= time.monotonic() - started < 2
    assert caught.value.code == "InternalFailure"
    assert caught.value.attempts >= 2


async def test_throttling_slows_the_shard_down() -> None:
    fake = FakeKinesis(shard_count=1)
    throttled_calls = {1, 2, 3}
    fake.entry_fault = lambda call, entry: THROTTLED if call in throttled_calls else None
    async with producer_for(fake, max_request_records=50, linger=0.0) as producer:
        await asyncio.gather(*await put_numbered(producer, 200, keys=10))
        engine = producer._engine
        assert engine is not None
        (lane,) = engine._lanes.values()
        assert lane.limiter.fraction < 1.0


async def test_wrong_stream_fails_at_start_and_nothing_is_accepted() -> None:
    producer = Producer("missing", clients=FakeClients(FakeKinesis()))
    with pytest.raises(ResourceNotFoundError):
        await producer.start()
    with pytest.raises(ProducerError, match="start the producer first"):
        await producer.put(b"x", "k")


async def test_invalid_records_raise_at_put_and_nothing_of_a_bad_batch_is_accepted() -> None:
    fake = FakeKinesis()
    async with producer_for(fake, max_record_bytes=1_000, aggregation_max_bytes=1_000) as producer:
        with pytest.raises(InvalidPartitionKeyError):
            await producer.put(b"x", "")
        with pytest.raises(RecordTooLargeError):
            await producer.put(b"x" * 1_000, "k")
        with pytest.raises(InvalidPartitionKeyError):
            await producer.put_many([(b"a", "k"), (b"b", "")])
        assert producer.metrics().records_put == 0
    assert fake.calls == 0


async def test_close_delivers_every_accepted_record_and_then_refuses_puts() -> None:
    fake = FakeKinesis()
    producer = producer_for(fake, linger=10.0)  # nothing would go before close
    await producer.start()
    futures = await put_numbered(producer, 300, keys=5)
    await producer.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert_key_order(fake, 300)
    with pytest.raises(ProducerClosedError):
        await producer.put(b"x", "k")
    await producer.close()  # closing twice is harmless


async def test_close_with_a_timeout_fails_what_cannot_be_delivered() -> None:
    fake = FakeKinesis()
    fake.gate = asyncio.Event()  # every call hangs
    producer = producer_for(fake, request_timeout=60.0, linger=0.0)
    await producer.start()
    futures = await put_numbered(producer, 50, keys=5)
    started = time.monotonic()
    await producer.close(timeout=0.2)
    assert time.monotonic() - started < 2
    for future in futures:
        with pytest.raises(RecordDeliveryError) as caught:
            future.result()
        assert caught.value.code in {"Cancelled", "ProducerAborted"}


async def test_flush_waits_for_results_without_waiting_for_linger() -> None:
    fake = FakeKinesis()
    async with producer_for(fake, linger=30.0) as producer:
        futures = await put_numbered(producer, 10, keys=2)
        await asyncio.wait_for(producer.flush(), 2)
        assert all(f.done() for f in futures)


async def test_a_full_buffer_makes_put_wait_until_results_free_room() -> None:
    fake = FakeKinesis()
    fake.gate = asyncio.Event()
    async with producer_for(fake, buffer_max_records=10, linger=0.0) as producer:
        first = await put_numbered(producer, 10, keys=3)
        blocked = asyncio.create_task(producer.put(b"11|x", "k"))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        fake.gate.set()
        last = await asyncio.wait_for(blocked, 2)
        await asyncio.gather(*first, last)


async def test_tiny_buffer_still_delivers_everything_in_order() -> None:
    fake = FakeKinesis(shard_count=2)
    async with producer_for(fake, buffer_max_records=3, preserve_key_order=True) as producer:
        futures = await producer.put_many([(f"{i}|x".encode(), f"k{i % 4}") for i in range(400)])
        await asyncio.gather(*futures)
    assert_key_order(fake, 400)


@pytest.mark.parametrize("aggregate", [False, True])
async def test_a_split_is_noticed_and_predictions_follow_the_new_shards(aggregate: bool) -> None:
    fake = FakeKinesis(shard_count=2)
    async with producer_for(fake, aggregate=aggregate, min_shard_refresh_interval=0.0) as producer:
        first = await put_numbered(producer, 300, keys=40)
        await asyncio.gather(*first)
        fake.split_first_shard()  # the producer is not told
        second = [await producer.put(f"{300 + i}|x".encode(), f"key-{i % 40}") for i in range(300)]
        await asyncio.gather(*second)
        await producer.flush()
        third = await asyncio.gather(
            *[await producer.put(f"{600 + i}|x".encode(), f"key-{i % 40}") for i in range(300)]
        )
        for i, result in enumerate(third):
            key = f"key-{i % 40}"
            assert producer.predict_shard(key) == result.shard_id
            assert result.shard_id == fake.shard_for(hash_of({"PartitionKey": key}))
        assert producer.metrics().shard_map_refreshes >= 2
    # Each user record is (also) where a consumer filtering by hash range would find it.
    ranges = {s: (start, end) for s, start, end in [*fake.open_shards, *fake.closed_shards]}
    found: set[int] = set()
    for shard_id, records in fake.user_records().items():
        start, end = ranges[shard_id]
        for record in records:
            if start <= record.hash_key <= end:
                found.add(sequence_of(record.data))
    assert found == set(range(900))


async def test_metrics_callback_gets_interval_snapshots() -> None:
    fake = FakeKinesis()
    seen: list[ProducerMetricsSnapshot] = []
    producer = Producer(
        "s",
        settings=settings(metrics_interval=0.05),
        clients=FakeClients(fake),
        on_metrics=seen.append,
    )
    async with producer:
        await asyncio.gather(*await put_numbered(producer, 50, keys=5))
        await asyncio.sleep(0.12)
        await asyncio.gather(*await put_numbered(producer, 30, keys=5))
    assert len(seen) >= 3  # at least two periodic ones and the final one
    assert sum(s.records_succeeded for s in seen) == 80
    assert sum(s.records_put for s in seen) == 80
