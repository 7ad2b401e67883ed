from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.consumer.checkpointing.acks import AckTracker
from shardflow.errors import CompletedStateError
from shardflow.read.completed import (
    CompletedState,
    decode_completed,
    encode_completed,
)
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record

DYNAMODB_ITEM_LIMIT = 400 * 1024
# A realistic Kinesis sequence number: 56 digits.
FIRST_SEQ = 49590338271490256608559692538361571095921575989136588898


@st.composite
def completed_states(draw: st.DrawFn) -> CompletedState:
    seq = draw(st.integers(0, 10**56))
    base = (
        ExtendedSequenceNumber(str(seq), draw(st.integers(0, 300))) if draw(st.booleans()) else None
    )
    completed: list[ExtendedSequenceNumber] = []
    sub = base.sub_sequence_number if base else -1
    for _ in range(draw(st.integers(0, 40))):
        if draw(st.booleans()):  # next sub-record of the same Kinesis record
            sub += draw(st.integers(1, 3))
        else:
            seq += draw(st.integers(1, 2**90))
            sub = draw(st.integers(0, 3))
        completed.append(ExtendedSequenceNumber(str(seq), sub))
    return CompletedState(base, tuple(completed))


@settings(max_examples=300, deadline=None)
@given(state=completed_states())
def test_round_trip(state: CompletedState) -> None:
    assert decode_completed(encode_completed(state)) == state


def sparse_tracker(count: int, *, max_gap: int, seed: int = 3) -> AckTracker:
    """``count`` records with every other one acked, the first one not: all beyond the prefix."""
    rng = random.Random(seed)
    tracker = AckTracker()
    seq = FIRST_SEQ
    handles = []
    for _ in range(count):
        seq += rng.randint(1, max_gap)
        handles.append(tracker.deliver(Record(b"", "pk", str(seq))))
    for handle in handles[1::2]:
        handle.ack()
    return tracker


@pytest.mark.parametrize("max_gap", [2**20, 2**64, 2**90])
def test_ten_thousand_sparse_acks_fit_well_in_a_dynamodb_item(max_gap: int) -> None:
    tracker = sparse_tracker(20_000, max_gap=max_gap)
    state = tracker.completed_state()
    assert state.base is None
    assert len(state.completed) == 10_000
    encoded = encode_completed(state)
    assert len(encoded) < DYNAMODB_ITEM_LIMIT // 3
    assert decode_completed(encoded) == state


def test_aggregates_with_partly_acked_sub_records_round_trip() -> None:
    rng = random.Random(5)
    tracker = AckTracker()
    seq = FIRST_SEQ
    handles = []
    for _ in range(2_000):
        seq += rng.randint(1, 2**40)
        last = rng.randint(0, 8)
        for sub in range(last + 1):
            record = Record(
                b"", "pk", str(seq), sub, aggregated=True, last_sub_sequence_number=last
            )
            handles.append(tracker.deliver(record))
    handles[0].ack()
    for handle in handles[2:]:
        if rng.random() < 0.6:
            handle.ack()
    state = tracker.completed_state()
    assert state.base == handles[0].position
    assert decode_completed(encode_completed(state)) == state


def test_size_guard_keeps_only_the_prefix() -> None:
    rng = random.Random(11)
    base = ExtendedSequenceNumber(str(FIRST_SEQ))
    seqs = sorted({FIRST_SEQ + rng.randint(1, 2**80) for _ in range(2_000)})
    full = CompletedState(base, tuple(ExtendedSequenceNumber(str(seq)) for seq in seqs))
    assert len(encode_completed(full)) > 10_000
    truncated = encode_completed(full, max_bytes=10_000)
    assert len(truncated) <= 10_000
    assert decode_completed(truncated) == CompletedState(base, ())


def test_encoder_rejects_positions_out_of_order_or_at_the_base() -> None:
    base = ExtendedSequenceNumber("100", 2)
    bad_orders = [
        (ExtendedSequenceNumber("100", 2),),
        (ExtendedSequenceNumber("100", 1),),
        (ExtendedSequenceNumber("200"), ExtendedSequenceNumber("150")),
        (ExtendedSequenceNumber(TRIM_HORIZON),),
    ]
    for completed in bad_orders:
        with pytest.raises(CompletedStateError):
            encode_completed(CompletedState(base, completed))
    with pytest.raises(CompletedStateError):
        encode_completed(CompletedState(ExtendedSequenceNumber(TRIM_HORIZON), ()))


def test_malformed_bytes_are_a_typed_error() -> None:
    good = encode_completed(
        CompletedState(ExtendedSequenceNumber("100"), (ExtendedSequenceNumber("105"),))
    )
    body = zlib.decompress(good[1:])
    malformed = [
        b"",
        b"\x02" + good[1:],  # unknown version
        good[:-3],  # truncated zlib stream
        b"\x01not zlib at all",
        b"\x01" + zlib.compress(body + b"\x00"),  # trailing bytes
        b"\x01" + zlib.compress(body[:-1]),  # truncated body
        b"\x01" + zlib.compress(b"\x03abc\x00\x00"),  # base is not a number
        b"\x01" + zlib.compress(b"\x00" + b"\xff" * 60),  # overlong varint
        b"\x01" + zlib.compress(b"\x00\x01\x05\x00"),  # a sequence number with no records
    ]
    for data in malformed:
        with pytest.raises(CompletedStateError):
            decode_completed(data)


def test_decoder_refuses_a_compression_bomb() -> None:
    bomb = b"\x01" + zlib.compress(b"\x00" * (64 * 1024 * 1024), 9)
    assert len(bomb) < 100_000
    with pytest.raises(CompletedStateError):
        decode_completed(bomb)
