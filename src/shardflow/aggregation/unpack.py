"""Unpacking one Kinesis record a slice at a time, checking every field of every user record.

A 1 MiB aggregate of small user records holds ~75,000 of them; making them all at once
takes a third of a second, far too long for an event loop that must also renew leases. An
:class:`Unpacking` does the work in steps of a bounded number of user records, so a caller
on an event loop can yield between steps (see :mod:`shardflow.read.intake`).

The all-or-nothing rule of :mod:`shardflow.aggregation.decode` holds: every user record is
checked before the first one is made, so a malformed aggregate is delivered whole as a plain
record (or raises), never half.

What is checked, beyond the framing, the MD5 and the protobuf itself:

- every partition key in the table is UTF-8 text of 1 to 256 characters (Kinesis' limits);
- every explicit hash key in the table is a decimal number without sign, spaces or leading
  zeros, at most 2**128 - 1 (the form Kinesis accepts);
- every user record's partition key index and explicit hash key index point into the tables.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from shardflow.aggregation._format import DIGEST_SIZE, FRAMING_BYTES, MAGIC
from shardflow.errors import AggregationError
from shardflow.records import Record, RecordBuilder, build_record
from shardflow.shards import MAX_HASH_KEY

if TYPE_CHECKING:
    from shardflow.aggregation._messages import AggregatedRecordMessage, RecordList

MalformedPolicy = Literal["plain", "raise"]

MAX_PARTITION_KEY_CHARS: Final = 256
_HASH_KEY: Final = re.compile(r"0|[1-9][0-9]{0,38}")


class UserRecordColumns(NamedTuple):
    """Every user record of an aggregate, column by column (see :meth:`Unpacking.columns`)."""

    data: list[bytes]
    partition_keys: list[str]
    explicit_hash_keys: list[str | None]
    resent_if_out_of_range: bool


class Unpacking:
    """The records of one Kinesis record, made by :meth:`step` a slice at a time.

    A record that is not an aggregate (or a user record already) yields itself. A malformed
    aggregate yields itself as a plain record with ``on_malformed="plain"`` (``malformed``
    then tells why), or :meth:`step` raises its :class:`AggregationError` with ``"raise"``.
    """

    __slots__ = (
        "_budget",
        "_build",
        "_checks",
        "_explicit_hash_keys",
        "_made",
        "_message",
        "_on_malformed",
        "_partition_keys",
        "_records",
        "_resent",
        "malformed",
        "record",
    )

    def __init__(
        self,
        record: Record,
        *,
        on_malformed: MalformedPolicy = "plain",
        build: RecordBuilder = build_record,
    ) -> None:
        if on_malformed not in ("plain", "raise"):
            raise ValueError(f"on_malformed must be 'plain' or 'raise', got {on_malformed!r}")
        self.record = record
        self.malformed: AggregationError | None = None
        """Why the record was delivered plain although it starts with the KPL magic."""
        self._on_malformed = on_malformed
        self._build = build
        self._message: AggregatedRecordMessage | None = None
        self._records: RecordList | None = None
        self._partition_keys: list[str] = []
        self._explicit_hash_keys: list[str] = []
        self._checks: Iterator[None] | None = None
        self._budget = 1
        self._made = 0
        self._resent = False
        if record.aggregated or not record.data.startswith(MAGIC):
            return
        try:
            self._open()
        except AggregationError as error:
            self._malformed(error)

    @property
    def aggregate(self) -> bool:
        """True while unpacking a well-formed aggregate (false for plain and malformed)."""
        return self._records is not None

    @property
    def done(self) -> bool:
        """Every record was handed out by :meth:`step`."""
        records = self._records
        if records is None:
            return self._made > 0
        return self._made >= len(records)

    def step(self, budget: int) -> list[Record]:
        """At most ``budget`` user records' worth of work; the records made by it, in order.

        While the aggregate is still being checked a step makes no records (an empty list
        does not mean done: ask :attr:`done`). Raises the :class:`AggregationError` of a
        malformed aggregate under ``on_malformed="raise"``.
        """
        records = self._records
        if records is None:
            if self._made:
                return []
            if self.malformed is not None and self._on_malformed == "raise":
                raise self.malformed
            self._made = 1
            return [self.record]
        budget = max(1, budget)
        if self._checks is not None:
            self._budget = budget
            try:
                next(self._checks)
            except StopIteration:
                self._checks = None
            except AggregationError as error:
                self._malformed(error)
                return self.step(budget)
            return []
        count = len(records)
        end = min(count, self._made + budget)
        made = self._make(records, self._made, end)
        self._made = end
        if end >= count:
            self._message = self._records = None  # done: let the parsed message go
            self._made = 1
        return made

    def columns(self) -> UserRecordColumns | None:
        """Every user record at once, column by column, checked as :meth:`step` checks them,
        for a caller that needs no :class:`Record` of them; instead of :meth:`step`.

        None for a record that is not an aggregate, and for a malformed one under
        ``on_malformed="plain"`` (:attr:`malformed` says why: the caller delivers the record
        as it is); under ``"raise"`` a malformed aggregate raises its
        :class:`AggregationError`.
        """
        message = self._message
        if message is not None and self._checks is not None:
            self._budget = 1 << 62  # no pauses
            # Tables only: an index out of range fails the lookups below, which then run the
            # index checks for the error that names it.
            self._run_checks(self._check_all(message, indexes=False))
        records = self._records
        if records is not None:
            partition_keys = self._partition_keys
            explicit_hash_keys = self._explicit_hash_keys
            try:
                columns = UserRecordColumns(
                    [sub.data for sub in records],
                    [partition_keys[sub.partition_key_index] for sub in records],
                    [
                        explicit_hash_keys[sub.explicit_hash_key_index]
                        if sub.HasField("explicit_hash_key_index")
                        else None
                        for sub in records
                    ],
                    self._resent,
                )
            except IndexError:
                assert message is not None
                self._run_checks(self._check_all(message))
                assert self.malformed is not None, "an index out of range the checks let pass"
            else:
                self.abandon()
                return columns
        if self.malformed is not None and self._on_malformed == "raise":
            raise self.malformed
        return None

    def _run_checks(self, checks: Iterator[None]) -> None:
        """Run ``checks`` through; a malformed aggregate is then marked so."""
        self._checks = None
        try:
            for _ in checks:
                pass
        except AggregationError as error:
            self._malformed(error)

    def abandon(self) -> None:
        """Make nothing more (the caller handles the record some other way)."""
        self._message = self._records = self._checks = None
        self._made = 1

    # --- checking ------------------------------------------------------------------------

    def _error(self, reason: str, detail: str) -> AggregationError:
        record = self.record
        return AggregationError(
            reason, detail, shard_id=record.shard_id, sequence_number=record.sequence_number
        )

    def _malformed(self, error: AggregationError) -> None:
        self.malformed = error
        self._message = self._records = self._checks = None
        self._made = 0

    def _open(self) -> None:
        """Framing, MD5, protobuf and the key tables (cheap next to the user records)."""
        data = memoryview(self.record.data)
        if len(data) < FRAMING_BYTES:
            raise self._error(
                "truncated",
                f"{len(data)} bytes cannot hold the magic and a {DIGEST_SIZE}-byte MD5",
            )
        body = data[len(MAGIC) : len(data) - DIGEST_SIZE]
        if hashlib.md5(body, usedforsecurity=False).digest() != data[len(data) - DIGEST_SIZE :]:
            raise self._error("md5", "the MD5 digest does not match the protobuf bytes")
        # protobuf is imported at the first aggregate, not with the package: a stream of plain
        # records (and the multilang daemon) never loads it (3.4 MiB of RSS per process).
        from google.protobuf.message import DecodeError

        from shardflow.aggregation._messages import new_aggregated_record

        message = new_aggregated_record()
        try:
            message.ParseFromString(body)
        except DecodeError:
            raise self._error("protobuf", "not a valid AggregatedRecord message") from None
        if len(message.records) == 0:
            raise self._error("protobuf", "the aggregate holds no user records")
        self._message = message
        self._resent = message.HasField("resends_out_of_range") and message.resends_out_of_range
        self._records = message.records
        self._checks = self._check_all(message)

    def _check_all(
        self, message: AggregatedRecordMessage, *, indexes: bool = True
    ) -> Iterator[None]:
        """Check tables and user records, pausing (yielding) after every ``_budget`` items.

        The required fields of every user record are checked in one call, as long as the parse
        before it (several milliseconds each for 1 MiB of small records): a step of its own.
        Without ``indexes`` the user records' table indexes are left unchecked (for a caller
        that looks every one of them up at once: an index out of range then raises
        IndexError)."""
        yield
        if not message.IsInitialized():
            raise self._error("protobuf", "a required field is missing")
        yield
        partition_keys = list(message.partition_key_table)
        explicit_hash_keys = list(message.explicit_hash_key_table)
        done = 0
        for index, key in enumerate(partition_keys):
            # For proto2 strings that are not valid UTF-8 the runtime returns bytes, not str.
            if not isinstance(key, str):
                raise self._error("protobuf", f"partition key {index} is not valid UTF-8")
            if not 1 <= len(key) <= MAX_PARTITION_KEY_CHARS:
                raise self._error(
                    "key",
                    f"partition key {index} has {len(key)} characters "
                    f"(1 to {MAX_PARTITION_KEY_CHARS} allowed)",
                )
            done += 1
            if done >= self._budget:
                done = 0
                yield
        for index, key in enumerate(explicit_hash_keys):
            if not isinstance(key, str):
                raise self._error("protobuf", f"explicit hash key {index} is not valid UTF-8")
            if not _HASH_KEY.fullmatch(key) or int(key) > MAX_HASH_KEY:
                raise self._error(
                    "key", f"explicit hash key {index} is not a hash key (0 to 2**128 - 1)"
                )
            done += 1
            if done >= self._budget:
                done = 0
                yield
        pk_count, ehk_count = len(partition_keys), len(explicit_hash_keys)
        for index, sub in enumerate(message.records if indexes else ()):
            if sub.partition_key_index >= pk_count:
                raise self._error(
                    "index",
                    f"user record {index} has partition_key_index {sub.partition_key_index} "
                    f"but the table has {pk_count} entries",
                )
            if sub.HasField("explicit_hash_key_index") and sub.explicit_hash_key_index >= ehk_count:
                raise self._error(
                    "index",
                    f"user record {index} has explicit_hash_key_index "
                    f"{sub.explicit_hash_key_index} but the table has {ehk_count} entries",
                )
            done += 1
            if done >= self._budget:
                done = 0
                yield
        self._partition_keys = partition_keys
        self._explicit_hash_keys = explicit_hash_keys

    # --- making --------------------------------------------------------------------------

    def _make(self, records: RecordList, start: int, end: int) -> list[Record]:
        outer = self.record
        partition_keys = self._partition_keys
        explicit_hash_keys = self._explicit_hash_keys
        last = len(records) - 1
        resent = self._resent
        build = self._build
        made: list[Record] = []
        for index in range(start, end):
            sub = records[index]
            explicit_hash_key = (
                explicit_hash_keys[sub.explicit_hash_key_index]
                if sub.HasField("explicit_hash_key_index")
                else None
            )
            made.append(
                build(
                    sub.data,
                    partition_keys[sub.partition_key_index],
                    outer.sequence_number,
                    index,
                    explicit_hash_key,
                    outer.approximate_arrival_timestamp,
                    outer.shard_id,
                    outer.stream_name,
                    True,
                    last,
                    resent,
                )
            )
        return made
