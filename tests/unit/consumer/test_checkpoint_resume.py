from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardflow.positions import StartPosition
from shardflow.read.completed import CompletedState, encode_completed
from shardflow.read.intake import resume_filter
from shardflow.records import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    Record,
)


def record(seq: int, sub: int = 0, last: int = 0) -> Record:
    return Record(b"", "pk", str(seq), sub, aggregated=last > 0, last_sub_sequence_number=last)


def test_a_record_checkpoint_resumes_at_its_sequence_number() -> None:
    plan = resume_filter(ExtendedSequenceNumber("500"))
    assert (plan.kind, plan.sequence_number) == ("AT_SEQUENCE_NUMBER", "500")
    assert [plan.keep(r) for r in (record(499), record(500), record(501))] == [False, False, True]


def test_a_partly_handled_aggregate_is_read_again_from_the_next_sub_record() -> None:
    plan = resume_filter(ExtendedSequenceNumber("500", 2))
    assert (plan.kind, plan.sequence_number) == ("AT_SEQUENCE_NUMBER", "500")
    kept = [
        r.sub_sequence_number for r in (record(500, sub, 4) for sub in range(5)) if plan.keep(r)
    ]
    assert kept == [3, 4]


@pytest.mark.parametrize("sentinel", [TRIM_HORIZON, LATEST, AT_TIMESTAMP])
def test_sentinels_map_to_themselves_and_keep_everything(sentinel: str) -> None:
    plan = resume_filter(ExtendedSequenceNumber(sentinel))
    assert (plan.kind, plan.sequence_number) == (sentinel, None)
    assert plan.keep(record(1))


def test_a_finished_shard_keeps_nothing() -> None:
    plan = resume_filter(ExtendedSequenceNumber(SHARD_END))
    assert plan.kind == "SHARD_END"
    assert not plan.keep(record(10**40))


def test_plans_convert_to_start_positions() -> None:
    at = resume_filter(ExtendedSequenceNumber("500", 2)).start_position()
    assert at == StartPosition.at_sequence_number("500")
    assert resume_filter(ExtendedSequenceNumber(TRIM_HORIZON)).start_position() == (
        StartPosition.trim_horizon()
    )
    assert resume_filter(ExtendedSequenceNumber(LATEST)).start_position() == StartPosition.latest()
    moment = datetime(2024, 5, 1, tzinfo=UTC)
    timestamp_plan = resume_filter(ExtendedSequenceNumber(AT_TIMESTAMP))
    assert timestamp_plan.start_position(moment) == StartPosition.at_timestamp(moment)
    with pytest.raises(ValueError, match="initial timestamp"):
        timestamp_plan.start_position()
    assert resume_filter(ExtendedSequenceNumber(SHARD_END)).start_position() is None


def test_a_malformed_checkpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="not a checkpoint"):
        resume_filter(ExtendedSequenceNumber("12abc"))


def test_completed_records_of_the_same_checkpoint_are_skipped() -> None:
    checkpoint = ExtendedSequenceNumber("500", 1)
    state = encode_completed(
        CompletedState(
            checkpoint, (ExtendedSequenceNumber("500", 3), ExtendedSequenceNumber("700"))
        )
    )
    plan = resume_filter(checkpoint, state)
    candidates = [record(500, 2, 3), record(500, 3, 3), record(600), record(700), record(800)]
    assert [plan.keep(r) for r in candidates] == [True, False, True, False, True]
    assert plan.already_completed(record(700))


def test_state_of_another_checkpoint_or_corrupt_state_is_ignored() -> None:
    stale = encode_completed(
        CompletedState(ExtendedSequenceNumber("400"), (ExtendedSequenceNumber("700"),))
    )
    for state in (stale, b"\x01garbage"):
        plan = resume_filter(ExtendedSequenceNumber("500"), state)
        assert plan.completed == frozenset()
        assert plan.keep(record(700))


@given(
    checkpoint_seq=st.integers(0, 10**30),
    checkpoint_sub=st.integers(0, 5),
    seq=st.integers(0, 10**30),
    sub=st.integers(0, 5),
)
def test_the_predicate_is_the_extended_sequence_number_order(
    checkpoint_seq: int, checkpoint_sub: int, seq: int, sub: int
) -> None:
    checkpoint = ExtendedSequenceNumber(str(checkpoint_seq), checkpoint_sub)
    candidate = record(seq, sub, 5)
    assert resume_filter(checkpoint).keep(candidate) == (
        (seq, sub) > (checkpoint_seq, checkpoint_sub)
    )
