"""Compact storage of records completed beyond a checkpoint, kept next to it in the lease.

A shard's checkpoint can only cover the contiguous handled prefix; records handled after the
first gap are stored as a :class:`CompletedState` (:func:`encode_completed`) so that a restart
can skip them (:func:`decode_completed`, read by :func:`~shardflow.read.intake.resume_filter`).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from shardflow.errors import CompletedStateError
from shardflow.records import ExtendedSequenceNumber

# The logger these messages had while this code lived in the acks module: logging set-ups keep
# working unchanged.
log = logging.getLogger("shardflow.consumer.acks")


@dataclass(frozen=True, slots=True)
class CompletedState:
    """Records completed beyond a checkpoint: ``base`` is the checkpoint, ``completed`` lies after it.

    ``completed`` is in strictly increasing shard order and every position is after ``base``.
    """

    base: ExtendedSequenceNumber | None
    completed: tuple[ExtendedSequenceNumber, ...] = ()


DEFAULT_MAX_COMPLETED_BYTES: Final = 256 * 1024
"""Default size cap of encoded state: leaves room in a 400 KB DynamoDB item for the lease itself."""

_FORMAT_VERSION: Final = 1
# Decoding refuses to inflate beyond this, so a corrupt or hostile item cannot exhaust memory.
_MAX_DECODED_BYTES: Final = 16 * 1024 * 1024
_MAX_DECODED_RECORDS: Final = 2_000_000


def encode_completed(
    state: CompletedState, *, max_bytes: int = DEFAULT_MAX_COMPLETED_BYTES
) -> bytes:
    """Compact bytes for ``state``: one version byte, then a zlib stream.

    Positions are stored as the difference of each sequence number from the previous one plus
    runs of consecutive sub-sequence numbers, so sparse acknowledgements over long stretches of a
    shard stay small. If the result exceeds ``max_bytes`` the completed records are dropped and
    only the base is kept: a restart then re-processes them, which is always safe.
    """
    body = _encode_body(state)
    encoded = bytes([_FORMAT_VERSION]) + zlib.compress(body, 6)
    if len(encoded) > max_bytes and state.completed:
        log.warning(
            "completed-record state of %d records takes %d bytes (> %d): storing the checkpoint only",
            len(state.completed),
            len(encoded),
            max_bytes,
        )
        return encode_completed(CompletedState(state.base), max_bytes=max_bytes)
    return encoded


def decode_completed(data: bytes) -> CompletedState:
    """The state :func:`encode_completed` stored; :class:`CompletedStateError` if malformed."""
    if not data or data[0] != _FORMAT_VERSION:
        raise CompletedStateError(
            f"unknown completed-state format {data[:1].hex() or 'empty'} (expected version 1)"
        )
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data[1:], _MAX_DECODED_BYTES)
    except zlib.error as exc:
        raise CompletedStateError(f"completed state is not a valid zlib stream: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise CompletedStateError("completed state is truncated or too large")
    return _decode_body(body)


def _encode_body(state: CompletedState) -> bytes:
    out = bytearray()
    base = state.base
    if base is None:
        _put_varint(out, 0)
        previous_seq = 0
    else:
        if base.is_sentinel:
            raise CompletedStateError(
                f"completed state needs a record position as base, not {base}"
            )
        seq_text = base.sequence_number.encode("ascii")
        _put_varint(out, len(seq_text))
        out += seq_text
        _put_varint(out, base.sub_sequence_number)
        previous_seq = int(base.sequence_number)
    groups = _group_by_sequence_number(state.base, state.completed)
    _put_varint(out, len(groups))
    for seq, subs in groups:
        _put_varint(out, seq - previous_seq)
        previous_seq = seq
        runs = _runs(subs)
        _put_varint(out, len(runs))
        next_sub = 0
        for start, length in runs:
            _put_varint(out, start - next_sub)
            _put_varint(out, length - 1)
            next_sub = start + length
    return bytes(out)


def _group_by_sequence_number(
    base: ExtendedSequenceNumber | None, completed: Iterable[ExtendedSequenceNumber]
) -> list[tuple[int, list[int]]]:
    groups: list[tuple[int, list[int]]] = []
    previous = base
    for position in completed:
        if position.is_sentinel or (previous is not None and not position > previous):
            raise CompletedStateError(
                f"completed positions must be record positions in increasing order after the base;"
                f" got {position} after {previous}"
            )
        seq = int(position.sequence_number)
        if groups and groups[-1][0] == seq:
            groups[-1][1].append(position.sub_sequence_number)
        else:
            groups.append((seq, [position.sub_sequence_number]))
        previous = position
    return groups


def _runs(subs: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive numbers in an increasing list, as (start, length)."""
    runs: list[tuple[int, int]] = []
    for sub in subs:
        if runs and runs[-1][0] + runs[-1][1] == sub:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((sub, 1))
    return runs


def _decode_body(body: bytes) -> CompletedState:
    reader = _Reader(body)
    seq_length = reader.varint()
    base: ExtendedSequenceNumber | None = None
    previous_seq = 0
    if seq_length:
        seq_text = reader.take(seq_length).decode("ascii", errors="replace")
        if not seq_text.isdigit():
            raise CompletedStateError(f"completed state has a malformed base {seq_text!r}")
        base = ExtendedSequenceNumber(seq_text, reader.varint())
        previous_seq = int(seq_text)
    completed: list[ExtendedSequenceNumber] = []
    for _ in range(reader.varint()):
        seq = previous_seq + reader.varint()
        previous_seq = seq
        seq_text = str(seq)
        next_sub = 0
        run_count = reader.varint()
        if run_count == 0:
            raise CompletedStateError("completed state has a sequence number without records")
        for _ in range(run_count):
            start = next_sub + reader.varint()
            length = reader.varint() + 1
            if len(completed) + length > _MAX_DECODED_RECORDS:
                raise CompletedStateError("completed state lists implausibly many records")
            completed.extend(
                ExtendedSequenceNumber(seq_text, sub) for sub in range(start, start + length)
            )
            next_sub = start + length
    if not reader.at_end:
        raise CompletedStateError("completed state has trailing bytes")
    if base is not None and completed and not completed[0] > base:
        raise CompletedStateError("completed state lists a record at or before its base")
    return CompletedState(base, tuple(completed))


def _put_varint(out: bytearray, value: int) -> None:
    """Unsigned LEB128 (as in protobuf): 7 bits a byte, high bit set on all but the last."""
    if value < 0:
        raise CompletedStateError(f"cannot encode negative number {value}")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


class _Reader:
    __slots__ = ("_data", "_offset")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._offset = 0

    @property
    def at_end(self) -> bool:
        return self._offset == len(self._data)

    def take(self, count: int) -> bytes:
        end = self._offset + count
        if end > len(self._data):
            raise CompletedStateError("completed state is truncated")
        chunk = self._data[self._offset : end]
        self._offset = end
        return chunk

    def varint(self) -> int:
        value = shift = 0
        data = self._data
        while True:
            if self._offset >= len(data):
                raise CompletedStateError("completed state is truncated")
            byte = data[self._offset]
            self._offset += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 7 * 40:  # far beyond any sequence number (~190 bits)
                raise CompletedStateError("completed state has an overlong number")
