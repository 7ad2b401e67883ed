"""Fetchers make plain records, or the consumer's not-yet-delivered ConsumedRecords when it gives
them its builder; delivery completes or copies each once, never changing one after a handler
could have seen it."""

from __future__ import annotations

import dataclasses

from shardflow.consumer.checkpointing.acks import (
    AckTracker,
    ConsumedRecord,
    ack_run,
    bind_delivered,
    build_undelivered,
)
from shardflow.fetch.batch import batch_from_kinesis, record_from_kinesis
from shardflow.records import Record

RECORD_FIELDS = dataclasses.fields(Record)
RAW = {"Data": b"payload", "PartitionKey": "pk", "SequenceNumber": "49590000000000000001"}


def test_a_fetched_record_is_plain_and_delivery_makes_the_consumed_one() -> None:
    fetched = record_from_kinesis(RAW, shard_id="s-1", stream_name="x")
    assert type(fetched) is Record
    tracker = AckTracker("s-1")
    delivered = bind_delivered(fetched, "value", tracker, tracker.register(fetched))
    assert type(delivered) is ConsumedRecord
    assert all(getattr(fetched, f.name) == getattr(delivered, f.name) for f in RECORD_FIELDS)
    assert delivered.value == "value"
    assert delivered.handle is not None
    delivered.ack()
    assert tracker.all_acked


def test_a_record_made_undelivered_is_completed_in_place_once() -> None:
    batch = batch_from_kinesis(
        {"Records": [RAW]}, shard_id="s-1", stream_name="x", shard_ended=False,
        build=build_undelivered,
    )  # fmt: skip
    (fetched,) = batch.records
    assert type(fetched) is ConsumedRecord
    assert fetched.handle is None  # not delivered yet: nothing to ack
    tracker = AckTracker("s-1")
    delivered = bind_delivered(fetched, "value", tracker, tracker.register(fetched))
    assert delivered is fetched  # one object from the fetch to the handler
    assert (delivered.value, delivered.data) == ("value", b"payload")
    # Delivered again (a second tracker): a copy, the first stays as a handler saw it.
    other = AckTracker("s-1")
    again = bind_delivered(delivered, "other", other, other.register(delivered))
    assert again is not delivered
    assert (delivered.value, again.value) == ("value", "other")
    delivered.ack()
    assert tracker.all_acked
    assert not other.all_acked


def test_a_record_delivered_twice_is_two_objects() -> None:
    first_tracker, second_tracker = AckTracker("s-1"), AckTracker("s-1")
    fetched = record_from_kinesis(RAW, shard_id="s-1", stream_name="x")
    first = bind_delivered(fetched, 1, first_tracker, first_tracker.register(fetched))
    second = bind_delivered(first, 2, second_tracker, second_tracker.register(first))
    assert second is not first
    assert (first.value, second.value) == (1, 2)
    second.ack()
    assert second_tracker.all_acked
    assert not first_tracker.all_acked
    first.ack()
    assert first_tracker.all_acked


def test_a_plain_record_is_copied_into_a_consumed_one() -> None:
    plain = Record(b"x", "pk", "49590000000000000002", shard_id="s-1")
    tracker = AckTracker("s-1")
    consumed = bind_delivered(plain, b"x", tracker, tracker.register(plain))
    assert type(consumed) is ConsumedRecord
    assert consumed == ConsumedRecord(b"x", "pk", "49590000000000000002", shard_id="s-1")


def delivered_run(tracker: AckTracker, count: int, first: int = 1) -> list[ConsumedRecord[int]]:
    records = [
        Record(b"x", "pk", f"4959{n:016d}", shard_id="s-1") for n in range(first, first + count)
    ]
    return [bind_delivered(r, n, tracker, tracker.register(r)) for n, r in enumerate(records)]


def test_ack_run_acks_just_the_run_of_one_tracker_in_one_step() -> None:
    tracker = AckTracker("s-1")
    records = delivered_run(tracker, 4)
    ack_run(records, 2, 2)
    assert tracker.pending.unacked == 4
    ack_run(records, 1, 3)
    assert tracker.pending.unacked == 2
    assert not tracker.all_acked
    ack_run(records, 0, 4)
    assert tracker.all_acked


def test_ack_run_over_records_of_two_trackers_acks_each_record() -> None:
    first_tracker, second_tracker = AckTracker("s-1"), AckTracker("s-1")
    records = [*delivered_run(first_tracker, 2), *delivered_run(second_tracker, 2, first=3)]
    ack_run(records, 1, 3)
    assert (first_tracker.pending.unacked, second_tracker.pending.unacked) == (1, 1)
    ack_run(records, 0, 4)
    assert first_tracker.all_acked
    assert second_tracker.all_acked
