"""The shard worker's pipeline against a stand-in lease and fetcher (no AWS, no coordinator)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from shardflow.aggregation import AggregateBuilder
from shardflow.clock import SYSTEM_CLOCK
from shardflow.consumer.checkpointing.acks import ConsumedRecord
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.delivery.engine import DispatchedShards
from shardflow.consumer.delivery.settings import DEFAULT_DELIVERY
from shardflow.consumer.lifecycle.shard import ShardResult, ShardWorker, StopReason
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.consumer.settings import ConsumerSettings
from shardflow.errors import DeserializationError, HandlerError
from shardflow.positions import StartPosition
from shardflow.read.completed import CompletedState, encode_completed
from shardflow.records import ExtendedSequenceNumber, Record, as_json
from shardflow.shards import ChildShard, HashKeyRange
from unit.consumer.test_shard_worker_kit import (
    SHARD,
    STREAM,
    ScriptedFetcher,
    StubLease,
    eventually,
    plain,
)

SHARD_END = ExtendedSequenceNumber("SHARD_END")


def worker_for(
    lease: StubLease,
    fetcher: ScriptedFetcher,
    metrics: ConsumerMetrics | None = None,
    **settings: Any,
) -> ShardWorker:
    return ShardWorker(lease, fetcher.open, settings=ConsumerSettings(**settings), metrics=metrics)


async def deliver(
    worker: ShardWorker, handler: Handler, *, batch: bool = False, auto_ack: bool = True
) -> ShardResult:
    """The worker's records through the consumer's delivery engine, as ``consume`` runs it."""
    shards = DispatchedShards(
        handler,
        DEFAULT_DELIVERY,
        sink=None,
        executor=None,
        clock=SYSTEM_CLOCK,
        batch=batch,
        auto_ack=auto_ack,
        metrics=worker.metrics,
    )
    return await shards(worker)


def batches_of(count: int, size: int, first: int = 1) -> list[list[Record]]:
    seq = first
    out = []
    for _ in range(count):
        out.append([plain(s) for s in range(seq, seq + size)])
        seq += size
    return out


def aggregate_record(
    seq: int, keys: list[tuple[str, str | None]], *, resends_out_of_range: bool = False
) -> Record:
    """An aggregate at ``seq`` holding one user record per (partition key, explicit hash key);
    ``resends_out_of_range`` marks it as shardflow's producer does."""
    builder = AggregateBuilder(resends_out_of_range=resends_out_of_range)
    for i, (key, ehk) in enumerate(keys):
        assert builder.try_add(key, f"{seq}/{i}".encode(), ehk)
    built = builder.build()
    return Record(
        data=built.data,
        partition_key=built.partition_key,
        sequence_number=str(seq),
        shard_id=SHARD,
        stream_name=STREAM,
    )


# --- delivery and SHARD_END ------------------------------------------------------------------


async def test_delivers_every_record_in_order_then_writes_shard_end() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(5, 7), children=(ChildShard("child-1", (SHARD,)),))
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)

    worker = worker_for(lease, fetcher)
    result = await asyncio.wait_for(deliver(worker, handler), 5)

    assert seen == [str(s) for s in range(1, 36)]
    assert result.reason is StopReason.SHARD_END
    assert lease.writer.written[-1] == SHARD_END
    assert [c.shard_id for c in result.children] == ["child-1"]


async def test_sync_batch_handler_runs_off_the_event_loop() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(3, 4))
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    sizes: list[int] = []

    def handler(records: list[ConsumedRecord[bytes]]) -> None:
        threads.add(threading.get_ident())
        sizes.append(len(records))

    result = await asyncio.wait_for(deliver(worker_for(lease, fetcher), handler, batch=True), 5)
    assert result.reason is StopReason.SHARD_END
    assert sum(sizes) == 12
    assert loop_thread not in threads


async def test_shard_end_waits_for_manual_acks_before_writing_shard_end() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(2, 3))
    held: list[ConsumedRecord[bytes]] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        held.append(record)  # acknowledged later, out of order

    worker = worker_for(lease, fetcher)
    run = asyncio.create_task(deliver(worker, handler, auto_ack=False))
    await eventually(lambda: len(held) == 6)
    for record in reversed(held[1:]):
        record.ack()
    await asyncio.sleep(0.05)
    assert not run.done()  # one record is still not handled
    assert SHARD_END not in lease.writer.written
    held[0].ack()
    result = await asyncio.wait_for(run, 5)
    assert result.reason is StopReason.SHARD_END
    assert lease.writer.written == [SHARD_END]


async def test_waiting_for_manual_acks_yields_to_the_loop_after_an_all_acked_moment() -> None:
    # Records delivered after every earlier one was acknowledged: the wait for their acks at
    # the shard's end must sleep, not spin (found by the multilang processors, which ack late).
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(2, 3))
    held: list[ConsumedRecord[bytes]] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        held.append(record)
        if len(held) == 3:
            for earlier in held:
                earlier.ack()  # the first batch, all acknowledged: the "all acked" moment

    worker = worker_for(lease, fetcher)
    run = asyncio.create_task(deliver(worker, handler, auto_ack=False))
    await eventually(lambda: len(held) == 6)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.process_time()
    await asyncio.sleep(0.3)
    busy = time.process_time() - started
    ticker.cancel()
    assert ticks >= 10, "the event loop was held"
    assert busy < 0.2, f"the wait spun: {busy:.2f} s of CPU in 0.3 s"
    assert not run.done()
    for record in held[3:]:
        record.ack()
    result = await asyncio.wait_for(run, 5)
    assert result.reason is StopReason.SHARD_END


async def test_stop_at_shard_end_with_unhandled_records_writes_no_shard_end() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(1, 4))
    held: list[ConsumedRecord[bytes]] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        held.append(record)

    worker = worker_for(lease, fetcher, drain_timeout=0.05)
    run = asyncio.create_task(deliver(worker, handler, auto_ack=False))
    await eventually(lambda: len(held) == 4)
    held[0].ack()
    held[1].ack()
    held[3].ack()
    worker.request_stop()
    result = await asyncio.wait_for(run, 5)
    assert result.reason is StopReason.STOPPED
    assert lease.writer.written == [ExtendedSequenceNumber("2")]


# --- backpressure ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
async def test_a_slow_handler_bounds_prefetch_in_records(batch: bool) -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(40, 50))  # 2,000 records, 50 per GetRecords
    worst_gap = 0
    handled = 0

    async def slow(records: Any) -> None:
        nonlocal worst_gap, handled
        await asyncio.sleep(0.001)
        handled += len(records) if batch else 1
        worst_gap = max(worst_gap, fetcher.records_fetched - handled)

    worker = worker_for(lease, fetcher, prefetch_records=200)
    result = await asyncio.wait_for(deliver(worker, slow, batch=batch), 20)

    assert result.reason is StopReason.SHARD_END
    assert handled == 2000
    assert worker.buffer.peak_records <= 200
    # At most the bound plus the one batch the fetch task holds while it waits for room.
    assert worst_gap <= 200 + 50
    assert worst_gap >= 100  # the buffer did fill: the bound, not the handler, limited it


async def test_prefetch_is_bounded_in_bytes() -> None:
    lease = StubLease()
    big = [[plain(s, data=b"x" * 1000) for s in range(b * 10 + 1, b * 10 + 11)] for b in range(20)]
    fetcher = ScriptedFetcher(big)
    worst = 0

    async def slow(record: ConsumedRecord[bytes]) -> None:
        nonlocal worst
        worst = max(worst, worker.buffer.bytes_in_use)
        await asyncio.sleep(0.0005)

    worker = worker_for(lease, fetcher, prefetch_bytes=4_100)
    result = await asyncio.wait_for(deliver(worker, slow), 20)
    assert result.reason is StopReason.SHARD_END
    assert worker.buffer.peak_bytes <= 4_100
    assert worst >= 2_000


async def test_a_stalled_handler_stops_the_fetcher() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(100, 10))
    release = asyncio.Event()

    async def stalled(record: ConsumedRecord[bytes]) -> None:
        await release.wait()

    worker = worker_for(lease, fetcher, prefetch_records=40)
    run = asyncio.create_task(deliver(worker, stalled))
    await asyncio.sleep(0.1)
    pulls_while_stalled = fetcher.pulls
    await asyncio.sleep(0.1)
    assert fetcher.pulls == pulls_while_stalled  # no further GetRecords while stalled
    assert fetcher.records_fetched <= 40 + 10
    release.set()
    result = await asyncio.wait_for(run, 10)
    assert result.reason is StopReason.SHARD_END
    assert fetcher.records_fetched == 1000


# --- resume filter ---------------------------------------------------------------------------


async def test_resume_skips_records_at_or_before_a_sub_record_checkpoint() -> None:
    # Checkpoint inside an aggregate: its sub-records 0 and 1 are handled, 2 is not.
    lease = StubLease(ExtendedSequenceNumber("20", 1))
    records = [
        aggregate_record(20, [("a", None), ("b", None), ("c", None)]),
        plain(21),
    ]
    fetcher = ScriptedFetcher([records])
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(str(record.position))

    worker = worker_for(lease, fetcher)
    result = await asyncio.wait_for(deliver(worker, handler), 5)

    assert seen == ["20.2", "21"]
    assert fetcher.start is not None
    assert fetcher.start.sequence_number == "20"  # AT the aggregate, to re-read its tail
    assert worker.intake.counts.before_checkpoint == 2
    assert result.reason is StopReason.SHARD_END


async def test_resume_skips_records_the_stored_state_lists_as_handled() -> None:
    base = ExtendedSequenceNumber("10")
    state = encode_completed(
        CompletedState(base, (ExtendedSequenceNumber("12"), ExtendedSequenceNumber("14")))
    )
    lease = StubLease(base, completed_state=state)
    fetcher = ScriptedFetcher([[plain(s) for s in range(10, 16)]], ends=False)
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)

    worker = worker_for(lease, fetcher)
    run = asyncio.create_task(deliver(worker, handler))
    await eventually(lambda: worker.caught_up)
    worker.request_stop()
    result = await asyncio.wait_for(run, 5)

    assert seen == ["11", "13", "15"]
    assert result.reason is StopReason.STOPPED
    # The skipped records count as handled: the checkpoint covers them.
    assert lease.writer.written[-1] == ExtendedSequenceNumber("15")


async def test_a_shard_end_checkpoint_reads_nothing() -> None:
    lease = StubLease("SHARD_END")
    fetcher = ScriptedFetcher(batches_of(1, 3))
    called = False

    async def handler(record: ConsumedRecord[bytes]) -> None:
        nonlocal called
        called = True

    result = await asyncio.wait_for(deliver(worker_for(lease, fetcher), handler), 5)
    assert result.reason is StopReason.ALREADY_ENDED
    assert fetcher.pulls == 0
    assert not called
    assert lease.writer.written == []


# --- hash-range rule -------------------------------------------------------------------------

LOW = HashKeyRange(0, 2**127 - 1)
INSIDE = str(2**126)
OUTSIDE = str(2**127 + 5)


@pytest.mark.parametrize(("policy", "expected"), [("deliver", 3), ("drop", 2)])
async def test_out_of_range_sub_records_follow_the_policy(policy: str, expected: int) -> None:
    lease = StubLease(hash_range=LOW)
    records = [aggregate_record(7, [("a", INSIDE), ("b", OUTSIDE), ("c", INSIDE)])]
    fetcher = ScriptedFetcher([records])
    metrics = ConsumerMetrics()
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.partition_key)

    worker = worker_for(lease, fetcher, metrics, out_of_range_sub_records=policy)
    result = await asyncio.wait_for(deliver(worker, handler), 5)

    assert len(seen) == expected
    assert ("b" in seen) is (policy == "deliver")
    assert worker.intake.counts.out_of_range == 1
    counters = metrics.snapshot().streams[STREAM]
    assert counters.out_of_range_dropped == (1 if policy == "drop" else 0)
    assert counters.out_of_range_delivered == (1 if policy == "deliver" else 0)
    # Dropped or not, the shard completes: the checkpoint moves over every sub-record.
    assert result.reason is StopReason.SHARD_END


@pytest.mark.parametrize("policy", ["deliver", "drop"])
async def test_out_of_range_copies_a_producer_sends_again_are_never_delivered(
    policy: str,
) -> None:
    # shardflow's producer puts a sub-record that landed outside its shard's range again on the
    # right shard and marks its aggregates so: this copy must not be handled as well.
    lease = StubLease(hash_range=LOW)
    marked = aggregate_record(7, [("a", INSIDE), ("b", OUTSIDE)], resends_out_of_range=True)
    fetcher = ScriptedFetcher([[marked]])
    metrics = ConsumerMetrics()
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.partition_key)

    worker = worker_for(lease, fetcher, metrics, out_of_range_sub_records=policy)
    result = await asyncio.wait_for(deliver(worker, handler), 5)

    assert seen == ["a"]
    assert metrics.snapshot().streams[STREAM].out_of_range_dropped == 1
    assert result.reason is StopReason.SHARD_END


async def test_plain_records_are_never_judged_by_hash_range() -> None:
    lease = StubLease(hash_range=HashKeyRange(0, 0))  # no MD5 of these keys lands at 0
    fetcher = ScriptedFetcher([[plain(1, key="x"), plain(2, key="y")]])
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)

    worker = worker_for(lease, fetcher, out_of_range_sub_records="drop")
    await asyncio.wait_for(deliver(worker, handler), 5)
    assert seen == ["1", "2"]


# --- lease loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_lost_lease_stops_delivery_at_once_and_no_checkpoint_follows(kind: str) -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(4, 25))
    seen: list[int] = []
    loop = asyncio.get_running_loop()

    def note(record: ConsumedRecord[bytes]) -> None:
        seen.append(int(record.sequence_number))
        if record.sequence_number == "10":
            # The coordinator's renewal finds the lease taken.
            if threading.get_ident() == loop_thread:
                lease.lose()
            else:
                loop.call_soon_threadsafe(lease.lose)
                time.sleep(0.05)  # the loop applies it before the next record

    async def async_handler(record: ConsumedRecord[bytes]) -> None:
        note(record)

    loop_thread = threading.get_ident()
    handler = async_handler if kind == "async" else note
    worker = worker_for(lease, fetcher, checkpoint=CheckpointSettings(every_n=3, interval=0.01))
    result = await asyncio.wait_for(deliver(worker, handler), 5)

    assert seen == list(range(1, 11))  # nothing after the record during which it was lost
    assert result.reason is StopReason.LOST
    assert all(p <= ExtendedSequenceNumber("10") for p in lease.writer.written)
    writes = len(lease.writer.written)
    await asyncio.sleep(0.05)
    assert len(lease.writer.written) == writes
    assert SHARD_END not in lease.writer.written


async def test_an_expired_lease_deadline_stops_delivery_like_a_loss() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(2, 5))
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)
        if len(seen) == 3:
            lease.expired = True  # renewals failed until the deadline passed

    result = await asyncio.wait_for(deliver(worker_for(lease, fetcher), handler), 5)
    assert seen == ["1", "2", "3"]
    assert result.reason is StopReason.LOST
    assert lease.writer.written == []


async def test_a_lease_lost_while_idle_wakes_the_worker() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(1, 2), ends=False)

    async def handler(record: ConsumedRecord[bytes]) -> None:
        return None

    worker = worker_for(lease, fetcher)
    run = asyncio.create_task(deliver(worker, handler))
    await eventually(lambda: worker.caught_up)
    lease.lose()
    result = await asyncio.wait_for(run, 2)
    assert result.reason is StopReason.LOST
    assert lease.writer.written == []


async def test_giving_up_checkpoints_what_was_handled() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(1, 5), ends=False)

    async def handler(record: ConsumedRecord[bytes]) -> None:
        return None

    worker = worker_for(lease, fetcher)
    run = asyncio.create_task(deliver(worker, handler))
    await eventually(lambda: worker.caught_up)
    lease.giving_up.set()
    result = await asyncio.wait_for(run, 2)
    assert result.reason is StopReason.GIVEN_UP
    assert lease.writer.written == [ExtendedSequenceNumber("5")]


# --- failures --------------------------------------------------------------------------------


async def test_a_handler_error_stops_the_shard_after_checkpointing_what_came_before() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(3, 5))
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)
        if record.sequence_number == "7":
            raise RuntimeError("boom")

    result = await asyncio.wait_for(deliver(worker_for(lease, fetcher), handler), 5)
    assert result.reason is StopReason.FAILED
    assert isinstance(result.error, HandlerError)
    assert result.error.sequence_number == "7"
    assert isinstance(result.error.__cause__, RuntimeError)
    assert seen == [str(s) for s in range(1, 8)]
    assert lease.writer.written == [ExtendedSequenceNumber("6")]


async def test_a_record_that_cannot_be_deserialized_stops_the_shard() -> None:
    lease = StubLease()
    records = [plain(1, data=b'{"a": 1}'), plain(2, data=b"not json"), plain(3, data=b"{}")]
    fetcher = ScriptedFetcher([records])
    seen: list[Any] = []

    async def handler(record: ConsumedRecord[Any]) -> None:
        seen.append(record.value)

    worker = worker_for(lease, fetcher, deserializer=as_json)
    result = await asyncio.wait_for(deliver(worker, handler), 5)
    assert seen == [{"a": 1}]
    assert result.reason is StopReason.FAILED
    assert isinstance(result.error, DeserializationError)
    assert result.error.sequence_number == "2"
    assert lease.writer.written == [ExtendedSequenceNumber("1")]


async def test_a_failing_fetcher_fails_the_shard_with_its_error() -> None:
    lease = StubLease()

    async def broken(start: Any) -> Any:
        raise OSError("network down")
        yield  # pragma: no cover

    async def handler(record: ConsumedRecord[bytes]) -> None:
        return None

    worker = ShardWorker(lease, broken)
    result = await asyncio.wait_for(deliver(worker, handler), 5)
    assert result.reason is StopReason.FAILED
    assert isinstance(result.error, OSError)


# --- checkpoints while running ---------------------------------------------------------------


async def test_count_checkpoints_land_while_consuming() -> None:
    lease = StubLease()
    fetcher = ScriptedFetcher(batches_of(10, 10), ends=False)

    async def handler(record: ConsumedRecord[bytes]) -> None:
        await asyncio.sleep(0)

    worker = worker_for(lease, fetcher, checkpoint=CheckpointSettings(every_n=25))
    run = asyncio.create_task(deliver(worker, handler))
    await eventually(lambda: worker.caught_up)
    # Count flushes coalesce, but leave fewer than every_n records unwritten.
    await eventually(
        lambda: (
            bool(lease.writer.written) and lease.writer.written[-1] > ExtendedSequenceNumber("75")
        )
    )
    assert worker.checkpointer.pending.delivered == 100
    worker.request_stop()
    result = await asyncio.wait_for(run, 5)
    assert result.reason is StopReason.STOPPED
    assert lease.writer.written[-1] == ExtendedSequenceNumber("100")
    positions = lease.writer.written
    assert positions == sorted(positions)
    assert worker.checkpointer.pending.lag == 0


async def test_an_at_timestamp_lease_without_a_configured_moment_reads_from_the_horizon() -> None:
    lease = StubLease("AT_TIMESTAMP")
    fetcher = ScriptedFetcher(batches_of(1, 3))
    seen: list[str] = []

    async def handler(record: ConsumedRecord[bytes]) -> None:
        seen.append(record.sequence_number)

    result = await asyncio.wait_for(deliver(worker_for(lease, fetcher), handler), 5)
    assert fetcher.start is not None
    assert fetcher.start.kind.value == "TRIM_HORIZON"
    assert seen == ["1", "2", "3"]
    assert result.reason is StopReason.SHARD_END


async def test_an_at_timestamp_lease_reads_from_the_configured_moment() -> None:
    from datetime import UTC, datetime

    moment = datetime(2024, 5, 1, tzinfo=UTC)
    lease = StubLease("AT_TIMESTAMP")
    fetcher = ScriptedFetcher(batches_of(1, 1))

    async def handler(record: ConsumedRecord[bytes]) -> None:
        return None

    worker = worker_for(lease, fetcher, initial_position=StartPosition.at_timestamp(moment))
    await asyncio.wait_for(deliver(worker, handler), 5)
    assert fetcher.start is not None
    assert fetcher.start.timestamp == moment
