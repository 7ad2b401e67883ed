"""What a producer hands back for each record it wrote."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from shardflow.records import ExtendedSequenceNumber


class PutResult(NamedTuple):
    """Where a user record landed (immutable).

    For a record sent inside a KPL aggregate, ``aggregated`` is True and
    ``sub_sequence_number`` is its index in the aggregate (consumers see the same pair).
    ``attempts`` counts the PutRecords calls that carried the record, the successful one
    included. (A named tuple rather than a frozen dataclass: one is built per record, and
    this is three times cheaper to build.)
    """

    shard_id: str
    sequence_number: str
    attempts: int
    sub_sequence_number: int = 0
    aggregated: bool = False

    @property
    def position(self) -> ExtendedSequenceNumber:
        return ExtendedSequenceNumber(self.sequence_number, self.sub_sequence_number)


class ResultSink(Protocol):
    """Where a record's outcome goes: an ``asyncio.Future`` or a ``concurrent.futures.Future``.

    The producer settles each sink once, on its event loop thread, unless it is already done
    (e.g. cancelled by its owner).
    """

    def done(self) -> bool: ...

    def set_result(self, result: PutResult, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...
