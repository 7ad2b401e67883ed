from __future__ import annotations

import asyncio
import gc
import random
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.consumer.checkpointing import acks
from shardflow.consumer.checkpointing.acks import AckHandle, AckTracker
from shardflow.errors import DeliveryOrderError, RecordNotDeliveredError
from shardflow.records import LATEST, ExtendedSequenceNumber, Record


def plain(seq: int) -> Record:
    return Record(b"x", "pk", str(seq), shard_id="shardId-000000000000")


def sub_record(seq: int, sub: int, last: int) -> Record:
    return Record(
        b"x",
        "pk",
        str(seq),
        sub,
        shard_id="shardId-000000000000",
        aggregated=True,
        last_sub_sequence_number=last,
    )


@st.composite
def shard_records(draw: st.DrawFn) -> list[Record]:
    """Records of one shard in order: plain ones and aggregates, some with dropped sub-records."""
    records: list[Record] = []
    seq = draw(st.integers(10**20, 10**55))
    for _ in range(draw(st.integers(0, 12))):
        seq += draw(st.integers(1, 10**12))
        if draw(st.booleans()):
            last = draw(st.integers(0, 5))
            # Deaggregation may drop sub-records (hash key outside the shard): gaps in subs.
            subs = sorted(draw(st.sets(st.integers(0, last), min_size=1)))
            records.extend(sub_record(seq, sub, last) for sub in subs)
        else:
            records.append(plain(seq))
    return records


class Model:
    """The obvious O(n) definition of what the tracker must report."""

    def __init__(self) -> None:
        self.delivered: list[Record] = []
        self.acked: set[int] = set()

    def prefix(self) -> int:
        count = 0
        while count < len(self.delivered) and count in self.acked:
            count += 1
        return count

    def safe(self) -> ExtendedSequenceNumber | None:
        count = self.prefix()
        return self.delivered[count - 1].position if count else None

    def beyond(self) -> list[ExtendedSequenceNumber]:
        start = self.prefix()
        return [self.delivered[i].position for i in sorted(self.acked) if i > start]


def check(tracker: AckTracker, model: Model) -> None:
    safe = tracker.safe_position
    assert safe == model.safe()
    # Never past an unacked record.
    for i, record in enumerate(model.delivered):
        if i not in model.acked:
            assert safe is None or record.position > safe
    assert tracker.prefix_count == model.prefix()
    assert tracker.completed_beyond_prefix() == model.beyond()
    pending = tracker.pending
    assert pending.delivered == len(model.delivered)
    assert pending.unacked == len(model.delivered) - len(model.acked)
    assert tracker.all_acked == (len(model.acked) == len(model.delivered))


@settings(max_examples=150, deadline=None)
@given(records=shard_records(), data=st.data())
def test_safe_position_is_the_contiguous_acked_prefix(
    records: list[Record], data: st.DataObject
) -> None:
    with patch.object(acks, "_COMPACT_AFTER", 3):  # exercise compaction in small examples
        tracker = AckTracker("shardId-000000000000")
        model = Model()
        handles: list[AckHandle] = []
        for _ in range(3 * len(records) + 5):
            choices = ["deliver"] if len(model.delivered) < len(records) else []
            if model.delivered:
                choices += ["handle", "position", "record", "through"]
            if not choices:
                break
            action = data.draw(st.sampled_from(choices))
            if action == "deliver":
                record = records[len(model.delivered)]
                handles.append(tracker.deliver(record))
                model.delivered.append(record)
            else:
                # Acks repeat on purpose: they must be idempotent.
                i = data.draw(st.integers(0, len(model.delivered) - 1))
                record = model.delivered[i]
                if action == "handle":
                    handles[i].ack()
                elif action == "position":
                    tracker.ack(record.position)
                elif action == "record":
                    tracker.ack(record)
                else:
                    tracker.ack_through(record)
                    model.acked.update(range(i))
                model.acked.add(i)
            check(tracker, model)


@settings(max_examples=100, deadline=None)
@given(records=shard_records(), seed=st.integers(0, 2**32))
def test_every_ack_order_ends_at_the_last_record(records: list[Record], seed: int) -> None:
    tracker = AckTracker()
    handles = [tracker.deliver(record) for record in records]
    random.Random(seed).shuffle(handles)
    for handle in handles:
        handle.ack()
    assert tracker.safe_position == (records[-1].position if records else None)
    assert tracker.all_acked
    assert tracker.completed_beyond_prefix() == []


def test_many_records_in_random_order_with_compaction() -> None:
    rng = random.Random(7)
    records = [plain(10**30 + i * 1000) for i in range(20_000)]
    tracker = AckTracker()
    handles = [tracker.deliver(r) for r in records]
    order = list(range(len(records)))
    rng.shuffle(order)
    acked: set[int] = set()
    prefix = 0
    for step, i in enumerate(order):
        handles[i].ack()
        acked.add(i)
        while prefix in acked:
            prefix += 1
        if step % 997 == 0:
            assert tracker.prefix_count == prefix
            assert tracker.safe_position == (records[prefix - 1].position if prefix else None)
    assert tracker.safe_position == records[-1].position
    # The acked prefix was dropped from memory, not kept around.
    assert len(tracker._records) < len(records)


def test_records_the_acked_prefix_covers_are_let_go_before_a_compaction() -> None:
    """A shard checkpointed every 1,000 records of a 3,000-record batch: the tracker keeps
    none of the 2,000 checkpointed (but the last, the safe position), though it has not
    compacted (under 4,096 slots); before, it kept all of them until the compaction."""
    base = 10**30
    tracker = AckTracker()
    for i in range(3_000):
        tracker.deliver(plain(base + i))
    for through in (999, 1_999):
        tracker.ack_through(ExtendedSequenceNumber(str(base + through)))

    gc.collect()
    kept = {
        int(thing.sequence_number) - base
        for thing in gc.get_objects()
        if type(thing) is Record and thing.sequence_number.startswith("1000000")
    }
    assert kept & set(range(2_000)) == {1_999}, len(kept & set(range(2_000)))
    assert kept >= set(range(2_000, 3_000))
    assert tracker.safe_position == ExtendedSequenceNumber(str(base + 1_999))
    assert tracker.prefix_count == 2_000
    # What is not in the prefix is still found by position, acked and reported.
    tracker.ack(ExtendedSequenceNumber(str(base + 2_500)))
    assert tracker.completed_beyond_prefix() == [ExtendedSequenceNumber(str(base + 2_500))]
    tracker.ack_through(ExtendedSequenceNumber(str(base + 2_999)))
    assert tracker.all_acked


def test_aggregate_sub_records_each_count() -> None:
    tracker = AckTracker()
    subs = [sub_record(500, sub, 2) for sub in range(3)]
    handles = [tracker.deliver(r) for r in subs]
    handles[0].ack()
    handles[2].ack()
    assert tracker.safe_position == ExtendedSequenceNumber("500", 0)
    assert tracker.completed_beyond_prefix() == [ExtendedSequenceNumber("500", 2)]
    handles[1].ack()
    assert tracker.safe_position == ExtendedSequenceNumber("500", 2)


def test_delivery_must_be_in_shard_order() -> None:
    tracker = AckTracker("shardId-1")
    tracker.deliver(plain(10))
    with pytest.raises(DeliveryOrderError, match="shardId-1"):
        tracker.deliver(plain(10))
    with pytest.raises(DeliveryOrderError):
        tracker.deliver(plain(9))
    with pytest.raises(DeliveryOrderError):
        tracker.deliver(Record(b"", "pk", LATEST))


def test_acking_what_was_never_delivered_is_an_error() -> None:
    tracker = AckTracker("shardId-1")
    for seq in (10, 20, 30):
        tracker.deliver(plain(seq))
    with pytest.raises(RecordNotDeliveredError, match="15"):
        tracker.ack(ExtendedSequenceNumber("15"))
    with pytest.raises(RecordNotDeliveredError):
        tracker.ack(plain(40))
    with pytest.raises(RecordNotDeliveredError):
        tracker.ack_through(ExtendedSequenceNumber("5"))
    with pytest.raises(RecordNotDeliveredError):
        AckTracker().ack(plain(10))
    tracker.ack_through(ExtendedSequenceNumber("20"))
    # Within the released prefix, acks count as repeats.
    tracker.ack(ExtendedSequenceNumber("10"))
    assert tracker.safe_position == ExtendedSequenceNumber("20")


def test_pending_counts_and_checkpointed_marks() -> None:
    tracker = AckTracker()
    handles = [tracker.deliver(plain(seq)) for seq in range(1, 11)]
    for i in (0, 1, 2, 5, 6):
        handles[i].ack()
    pending = tracker.pending
    assert (pending.delivered, pending.unacked, pending.acked_unchecked) == (10, 5, 5)
    assert pending.lag == 10
    tracker.mark_checkpointed(tracker.prefix_count)
    pending = tracker.pending
    assert (pending.acked_unchecked, pending.checkpointed, pending.lag) == (2, 3, 7)
    tracker.mark_checkpointed(1)  # never goes back
    assert tracker.checkpointed_count == 3


def test_listeners_hear_changes_only() -> None:
    tracker = AckTracker()
    calls: list[int] = []
    tracker.add_listener(lambda: calls.append(tracker.acked_count))
    handle = tracker.deliver(plain(1))
    handle.ack()
    handle.ack()
    assert calls == [1]


async def test_ack_from_other_threads_reaches_the_loop() -> None:
    tracker = AckTracker()
    handles = [tracker.deliver(plain(seq)) for seq in range(1, 201)]
    loop = asyncio.get_running_loop()

    def sync_handler(batch: list[AckHandle]) -> None:
        for handle in reversed(batch):
            handle.ack()

    await asyncio.gather(
        *(loop.run_in_executor(None, sync_handler, handles[i : i + 50]) for i in range(0, 200, 50))
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert tracker.safe_position == ExtendedSequenceNumber("200")
    assert tracker.all_acked


async def test_ack_threadsafe_reports_errors_through_its_future() -> None:
    tracker = AckTracker()
    tracker.deliver(plain(1))
    loop = asyncio.get_running_loop()
    good = await loop.run_in_executor(None, tracker.ack_threadsafe, ExtendedSequenceNumber("1"))
    bad = await loop.run_in_executor(None, tracker.ack_threadsafe, ExtendedSequenceNumber("2"))
    assert await asyncio.wrap_future(good) is None
    with pytest.raises(RecordNotDeliveredError):
        await asyncio.wrap_future(bad)
    assert tracker.safe_position == ExtendedSequenceNumber("1")


@settings(max_examples=200, deadline=None)
@given(
    records=shard_records(),
    spans=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8),
    singles=st.lists(st.integers(0, 40), max_size=8),
)
def test_acking_slot_ranges_matches_acking_each_record(
    records: list[Record], spans: list[tuple[int, int]], singles: list[int]
) -> None:
    """ack_slots(first, last) is the same as acking every slot from first to last, whatever
    was acked before (a range over acked slots, or over the compacted prefix, changes nothing
    twice)."""
    bulk, one_by_one, model = AckTracker(), AckTracker(), Model()
    notified: list[int] = []
    bulk.add_listener(lambda: notified.append(bulk.acked_count))
    for record in records:
        index = bulk.register(record)
        assert one_by_one.register(record) == index
        model.delivered.append(record)
    n = len(records)
    for index in (i for i in singles if i < n):
        bulk.ack_index(index)
        one_by_one.ack_index(index)
        model.acked.add(index)
    for a, b in spans:
        first, last = sorted((a % n, b % n)) if n else (0, -1)
        before = len(notified)
        newly = any(i not in model.acked for i in range(first, last + 1))
        bulk.ack_slots(first, last)
        assert len(notified) == before + (1 if newly else 0), "one notification per step"
        for index in range(first, last + 1):
            one_by_one.ack_index(index)
            model.acked.add(index)
        assert bulk.acked_count == one_by_one.acked_count == len(model.acked)
        assert bulk.prefix_count == one_by_one.prefix_count == model.prefix()
        assert bulk.safe_position == one_by_one.safe_position
