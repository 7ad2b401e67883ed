from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.clock import ManualClock
from shardflow.consumer.checkpointing.acks import AckHandle
from shardflow.consumer.checkpointing.checkpoint import (
    SHARD_END_POSITION,
    Checkpointer,
    CheckpointSettings,
)
from shardflow.errors import ShardLeaseLostError, TransientError
from shardflow.events import CheckpointWritten, DiagnosticEvent, EventEmitter
from shardflow.read.completed import decode_completed
from shardflow.records import ExtendedSequenceNumber, Record

SHARD = "shardId-000000000007"


def esn(seq: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), sub)


class FakeWriter:
    """A lease store stand-in: records writes; can hold them open, fail, or lose the lease."""

    def __init__(self) -> None:
        self.writes: list[tuple[ExtendedSequenceNumber, bytes | None]] = []
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0
        self.finals: list[bool] = []

    @property
    def positions(self) -> list[ExtendedSequenceNumber]:
        return [position for position, _ in self.writes]

    async def write(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.error is not None:
                raise self.error
            self.writes.append((position, completed_state))
            self.finals.append(final)
        finally:
            self.in_flight -= 1


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def make(
    settings_: CheckpointSettings | None = None,
    *,
    records: int = 10,
    initial: ExtendedSequenceNumber | None = None,
) -> tuple[Checkpointer, FakeWriter, ManualClock, list[Record], list[AckHandle]]:
    writer = FakeWriter()
    clock = ManualClock()
    checkpointer = Checkpointer(
        writer, shard_id=SHARD, settings=settings_, clock=clock, initial=initial
    )
    batch = [Record(b"x", "pk", str(100 + i), shard_id=SHARD) for i in range(records)]
    handles = [checkpointer.tracker.deliver(record) for record in batch]
    return checkpointer, writer, clock, batch, handles


async def test_checkpoint_record_writes_up_to_and_including_it() -> None:
    checkpointer, writer, _, batch, _ = make()
    assert await checkpointer.checkpoint(batch[3]) == esn(103)
    assert writer.positions == [esn(103)]
    assert checkpointer.pending.acked_unchecked == 0
    assert checkpointer.lag == 6


async def test_checkpoint_without_record_writes_the_contiguous_acked_prefix() -> None:
    checkpointer, writer, _, _, handles = make()
    assert await checkpointer.checkpoint() is None  # nothing handled yet: no write
    for i in (0, 1, 3, 4):
        handles[i].ack()
    assert await checkpointer.checkpoint() == esn(101)
    handles[2].ack()
    assert await checkpointer.checkpoint() == esn(104)
    assert await checkpointer.checkpoint() == esn(104)  # nothing new: no second write
    assert writer.positions == [esn(101), esn(104)]


async def test_stage_marks_handled_without_writing_and_flush_writes() -> None:
    checkpointer, writer, _, batch, _ = make()
    checkpointer.stage(batch[2])
    checkpointer.stage(batch[1])  # staging an earlier record changes nothing
    assert writer.writes == []
    assert checkpointer.pending.acked_unchecked == 3
    assert await checkpointer.flush() == esn(102)
    assert writer.positions == [esn(102)]


async def test_sub_records_of_an_aggregate_are_checkpointed_one_by_one() -> None:
    writer = FakeWriter()
    checkpointer = Checkpointer(writer, shard_id=SHARD)
    subs = [
        Record(b"", "pk", "900", sub, aggregated=True, last_sub_sequence_number=3)
        for sub in range(4)
    ]
    handles = [checkpointer.tracker.deliver(r) for r in subs]
    handles[0].ack()
    handles[1].ack()
    handles[3].ack()
    assert await checkpointer.checkpoint() == esn(900, 1)
    handles[2].ack()
    assert await checkpointer.checkpoint() == esn(900, 3)


async def test_flush_by_count() -> None:
    checkpointer, writer, _, _, handles = make(CheckpointSettings(every_n=3))
    checkpointer.start()
    handles[0].ack()
    handles[1].ack()
    handles[3].ack()  # beyond a gap: does not count, the prefix did not grow
    await settle()
    assert writer.writes == []
    handles[2].ack()  # prefix now 4 records long
    await settle()
    assert writer.positions == [esn(103)]
    for i in (4, 5):
        handles[i].ack()
    await settle()
    assert writer.positions == [esn(103)]
    handles[6].ack()
    await settle()
    assert writer.positions == [esn(103), esn(106)]
    await checkpointer.stop()


async def test_flush_by_interval() -> None:
    checkpointer, writer, clock, _, handles = make(CheckpointSettings(interval=5.0))
    checkpointer.start()
    await settle()
    handles[0].ack()
    await clock.advance(4.9)
    assert writer.writes == []
    await clock.advance(0.2)
    assert writer.positions == [esn(100)]
    await clock.advance(20)  # nothing new: no further writes
    assert writer.positions == [esn(100)]
    handles[1].ack()
    await clock.advance(5)
    assert writer.positions == [esn(100), esn(101)]
    assert checkpointer.last_written_age == pytest.approx(0.0, abs=5.0)
    await checkpointer.stop()
    handles[2].ack()
    await clock.advance(50)  # stopped: no more automatic writes
    assert writer.positions == [esn(100), esn(101)]


class CountingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        await super().sleep(seconds)


async def test_an_idle_shard_keeps_no_interval_timer() -> None:
    # 1,000 idle shards at the default 5 s woke 200 times a second to find nothing to write.
    clock = CountingClock()
    writer = FakeWriter()
    checkpointer = Checkpointer(
        writer, shard_id=SHARD, settings=CheckpointSettings(interval=1.0), clock=clock
    )
    handles = [
        checkpointer.tracker.deliver(Record(b"x", "pk", str(100 + i), shard_id=SHARD))
        for i in range(3)
    ]
    checkpointer.start()
    await settle()
    await clock.advance(100.0)
    assert clock.sleeps == 0
    await clock.advance(0.5)
    handles[0].ack()
    await clock.advance(0.49)
    assert writer.writes == []
    await clock.advance(0.02)  # the tick after the ack, as before: at most an interval
    assert writer.positions == [esn(100)]
    await clock.advance(50.0)
    assert clock.sleeps == 1, "idle again: no timer"
    await checkpointer.stop()


async def test_concurrent_writes_coalesce_and_the_latest_position_wins() -> None:
    checkpointer, writer, _, _, handles = make()
    writer.gate = asyncio.Event()
    handles[0].ack()
    first = asyncio.create_task(checkpointer.checkpoint())
    await settle()
    assert writer.in_flight == 1
    waiting = []
    for handle in handles[1:6]:
        handle.ack()
        waiting.append(asyncio.create_task(checkpointer.checkpoint()))
    waiting.append(asyncio.create_task(checkpointer.flush()))
    await settle()
    writer.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert writer.positions == [esn(100), esn(105)]
    assert writer.max_in_flight == 1
    assert results == [esn(100)] + [esn(105)] * 6


async def test_never_writes_at_or_before_the_initial_checkpoint() -> None:
    checkpointer, writer, _, _, handles = make(initial=esn(103))
    for handle in handles[:4]:
        handle.ack()
    assert await checkpointer.checkpoint() == esn(103)
    assert writer.writes == []
    handles[4].ack()
    assert await checkpointer.checkpoint() == esn(104)
    assert writer.positions == [esn(104)]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_writes_are_monotonic_and_never_pass_an_unacked_record(data: st.DataObject) -> None:
    async def scenario() -> None:
        checkpointer, writer, _, batch, handles = make(records=15)
        acked: set[int] = set()
        for _ in range(30):
            action = data.draw(st.sampled_from(["ack", "stage", "checkpoint", "flush"]))
            i = data.draw(st.integers(0, len(batch) - 1))
            if action == "ack":
                handles[i].ack()
                acked.add(i)
            elif action == "stage":
                checkpointer.stage(batch[i])
                acked.update(range(i + 1))
            else:
                await (
                    checkpointer.checkpoint() if action == "checkpoint" else checkpointer.flush()
                )
        await checkpointer.final(shard_end=True)
        positions = writer.positions
        assert positions == sorted(set(positions))
        for position in positions:
            if position == SHARD_END_POSITION:
                assert acked == set(range(len(batch)))
                continue
            covered = [i for i, r in enumerate(batch) if r.position <= position]
            assert set(covered) <= acked

    asyncio.run(scenario())


async def test_final_writes_shard_end_only_when_everything_was_handled() -> None:
    checkpointer, writer, _, _, handles = make(records=3)
    handles[0].ack()
    handles[2].ack()
    assert await checkpointer.final(shard_end=True) == esn(100)
    assert writer.positions == [esn(100)]
    assert writer.finals == [True]
    handles[1].ack()
    assert await checkpointer.final(shard_end=True) == SHARD_END_POSITION
    assert writer.positions == [esn(100), SHARD_END_POSITION]
    assert checkpointer.lag == 0
    # After SHARD_END nothing can be written again.
    assert await checkpointer.flush() == SHARD_END_POSITION
    assert len(writer.writes) == 2


async def test_an_empty_ended_shard_checkpoints_shard_end() -> None:
    checkpointer, writer, _, _, _ = make(records=0)
    assert await checkpointer.final(shard_end=True) == SHARD_END_POSITION
    assert writer.positions == [SHARD_END_POSITION]


async def test_final_at_shutdown_writes_what_was_staged_and_stops_flushing() -> None:
    checkpointer, writer, clock, batch, _ = make(CheckpointSettings(every_n=100, interval=60))
    checkpointer.start()
    checkpointer.stage(batch[4])
    assert await checkpointer.final(shard_end=False) == esn(104)
    assert writer.positions == [esn(104)]
    assert writer.finals == [True], "the store may fold a pending handoff into this write"
    checkpointer.stage(batch[6])
    await clock.advance(600)
    assert writer.positions == [esn(104)]


async def test_no_writes_after_the_lease_was_lost() -> None:
    checkpointer, writer, clock, batch, handles = make(CheckpointSettings(every_n=1, interval=1))
    checkpointer.start()
    writer.error = ShardLeaseLostError(SHARD, owner="worker-b")
    handles[0].ack()
    await settle()
    assert checkpointer.lease_lost
    calls = writer.calls
    assert calls == 1
    writer.error = None  # even if the store would accept it now
    with pytest.raises(ShardLeaseLostError, match="worker-b"):
        await checkpointer.checkpoint(batch[1])
    with pytest.raises(ShardLeaseLostError):
        await checkpointer.flush()
    with pytest.raises(ShardLeaseLostError):
        checkpointer.stage(batch[2])
    handles[3].ack()
    await clock.advance(10)
    with pytest.raises(ShardLeaseLostError):
        await checkpointer.final(shard_end=False)
    assert writer.calls == calls
    assert writer.writes == []


async def test_lease_lost_during_a_manual_checkpoint_is_raised_to_the_caller() -> None:
    checkpointer, writer, _, batch, _ = make()
    writer.error = ShardLeaseLostError(SHARD)
    with pytest.raises(ShardLeaseLostError):
        await checkpointer.checkpoint(batch[0])
    writer.error = None
    with pytest.raises(ShardLeaseLostError):
        await checkpointer.checkpoint(batch[1])
    assert writer.calls == 1


async def test_a_failed_automatic_write_is_retried_at_the_next_tick() -> None:
    checkpointer, writer, clock, _, handles = make(CheckpointSettings(interval=1))
    checkpointer.start()
    await settle()
    writer.error = TransientError("boom", operation="UpdateItem")
    handles[0].ack()
    await clock.advance(1)
    assert isinstance(checkpointer.last_error, TransientError)
    assert writer.writes == []
    writer.error = None
    await clock.advance(1)
    assert writer.positions == [esn(100)]
    await checkpointer.stop()


async def test_stop_lets_a_write_in_progress_finish() -> None:
    checkpointer, writer, clock, _, handles = make(CheckpointSettings(interval=1))
    writer.gate = asyncio.Event()
    checkpointer.start()
    await settle()
    handles[0].ack()
    await clock.advance(1)
    assert writer.in_flight == 1
    stopping = asyncio.create_task(checkpointer.final(shard_end=False))
    await settle()
    writer.gate.set()
    assert await stopping == esn(100)
    assert writer.positions == [esn(100)]


async def test_every_write_is_an_event_and_a_subscriber_cannot_break_it() -> None:
    events: list[DiagnosticEvent] = []

    def broken(event: DiagnosticEvent) -> None:
        raise RuntimeError("subscriber bug")

    emitter = EventEmitter("w1", subscribers=[broken, events.append])
    checkpointer = Checkpointer(
        FakeWriter(), shard_id=SHARD, clock=ManualClock(), events=emitter.for_shard("s", SHARD)
    )
    batch = [Record(b"x", "pk", str(100 + i), shard_id=SHARD) for i in range(10)]
    for record in batch:
        checkpointer.tracker.deliver(record)
    await checkpointer.checkpoint(batch[2])
    await checkpointer.checkpoint(batch[5])
    written = [e for e in events if isinstance(e, CheckpointWritten)]
    assert [(e.position, e.previous, e.records, e.lag, e.reason) for e in written] == [
        (esn(102), None, 3, 7, "checkpoint"),
        (esn(105), esn(102), 3, 4, "checkpoint"),
    ]
    assert all((e.worker_id, e.stream, e.shard_id) == ("w1", "s", SHARD) for e in written)


async def test_observability_of_age_and_lag() -> None:
    checkpointer, _, clock, batch, _ = make()
    assert checkpointer.last_written is None
    assert checkpointer.last_written_age is None
    assert checkpointer.lag == 10
    await checkpointer.checkpoint(batch[1])
    await clock.advance(7)
    assert checkpointer.last_written == esn(101)
    assert checkpointer.last_written_age == pytest.approx(7.0)
    assert checkpointer.lag == 8


async def test_acks_from_a_thread_pool_advance_the_checkpoint() -> None:
    checkpointer, writer, _, _, handles = make(CheckpointSettings(every_n=10), records=40)
    checkpointer.start()
    loop = asyncio.get_running_loop()

    def sync_handler(batch: list[AckHandle]) -> None:
        for handle in batch:
            handle.ack()

    # Out of order across threads: the later half first.
    await loop.run_in_executor(None, sync_handler, handles[20:])
    await settle()
    assert writer.writes == []
    await loop.run_in_executor(None, sync_handler, handles[:20])
    await settle()
    # The loop may apply the acks while the thread is still sending them: a count flush can
    # fire part-way, but each write covers at least 10 new records and the last covers all.
    positions = writer.positions
    assert positions[-1] == esn(139)
    assert positions == sorted(set(positions))
    offsets = [int(p.sequence_number) - 99 for p in positions]  # records covered
    assert offsets[0] >= 10
    assert all(later - earlier >= 10 for earlier, later in itertools.pairwise(offsets))
    await checkpointer.stop()


async def test_completed_records_beyond_a_gap_are_stored_with_the_checkpoint() -> None:
    checkpointer, writer, _, _, handles = make(CheckpointSettings(store_completed=True))
    for i in (0, 1, 4, 6):
        handles[i].ack()
    assert await checkpointer.checkpoint() == esn(101)
    position, state = writer.writes[-1]
    assert state is not None
    decoded = decode_completed(state)
    assert decoded.base == position == esn(101)
    assert decoded.completed == (esn(104), esn(106))
    # Same prefix, more completed records: worth a write of its own.
    handles[7].ack()
    await checkpointer.flush()
    assert len(writer.writes) == 2
    assert decode_completed(writer.writes[-1][1] or b"").completed == (esn(104), esn(106), esn(107))
    await checkpointer.flush()
    assert len(writer.writes) == 2
    for i in (2, 3, 5):
        handles[i].ack()
    await checkpointer.flush()
    assert writer.writes[-1] == (esn(107), None)


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="every_n"):
        CheckpointSettings(every_n=0)
    with pytest.raises(ValueError, match="interval"):
        CheckpointSettings(interval=0)


class BrownoutWriter(FakeWriter):
    """Fails its first ``failures`` writes with ``error``, then writes (or loses the lease)."""

    def __init__(self, failures: int, error: Exception, then: Exception | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.fault = error
        self.then = then

    async def write(
        self,
        position: ExtendedSequenceNumber,
        *,
        completed_state: bytes | None = None,
        final: bool = False,
    ) -> None:
        if self.failures:
            self.failures -= 1
            self.calls += 1
            raise self.fault
        if self.then is not None:
            raise self.then
        await super().write(position, completed_state=completed_state, final=final)


async def shard_end_after(writer: FakeWriter) -> Checkpointer:
    """A checkpointer with every one of three records handled, asked for SHARD_END."""
    clock = ManualClock()
    checkpointer = Checkpointer(writer, shard_id=SHARD, clock=clock)
    for seq in (101, 102, 103):
        checkpointer.tracker.deliver(Record(b"x", "pk", str(seq), shard_id=SHARD)).ack()
    final = asyncio.ensure_future(checkpointer.final(shard_end=True))
    for _ in range(400):
        await settle()
        if final.done():
            break
        await clock.advance(0.25)
    await final
    return checkpointer


async def test_the_shard_end_checkpoint_outlasts_a_lease_table_brownout() -> None:
    writer = BrownoutWriter(40, TransientError("InternalServerError", code="InternalServerError"))
    checkpointer = await shard_end_after(writer)
    assert writer.positions == [SHARD_END_POSITION]
    assert checkpointer.last_written == SHARD_END_POSITION
    assert writer.calls == 41


async def test_the_final_checkpoint_retries_stop_when_the_lease_is_lost() -> None:
    writer = BrownoutWriter(5, TransientError("throttled"), then=ShardLeaseLostError(SHARD))
    with pytest.raises(ShardLeaseLostError):
        await shard_end_after(writer)
    assert writer.positions == []
