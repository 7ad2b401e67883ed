"""The work of one process of the intake fuzz test (tests/unit/read/test_intake_fuzz.py): ``count``
mutated aggregates from ``seed`` through :class:`~shardflow.read.intake.RecordIntake` as
GetRecords batches, every input checked to come out whole.

A module of its own (not the test's) so that a ``spawn``-ed process can import it by name.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from shardflow.read.intake import Intake, RecordIntake, Settled, resume_filter
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record
from shardflow.shards import HashKeyRange
from support.aggregate_fuzz import AggregateFuzzer

BATCH = 1_000
FIRST_SEQUENCE = 10**55


@dataclass(frozen=True)
class Tally:
    aggregates: int
    plain: int
    unpacked: int
    user_records: int
    problems: tuple[str, ...]


def _check_batch(batch: list[Record], items: list[Intake], problems: list[str]) -> tuple[int, int]:
    """Every input came out (plain, or as its user records) in order; (plain, unpacked)."""
    plain = unpacked = 0
    previous: ExtendedSequenceNumber | None = None
    for item in items:
        record = item.record if isinstance(item, Settled) else item
        if previous is not None and not record.position > previous:
            problems.append(f"position {record.position} after {previous}")
        previous = record.position
        if isinstance(item, Settled):
            problems.append(f"{record.position} not handed to the handler")
    by_sequence: dict[str, list[Record]] = {}
    for item in items:
        record = item.record if isinstance(item, Settled) else item
        by_sequence.setdefault(record.sequence_number, []).append(record)
    for kinesis_record in batch:
        out = by_sequence.get(kinesis_record.sequence_number, [])
        if out == [kinesis_record] and not out[0].aggregated:
            plain += 1
        elif out and all(r.aggregated for r in out):
            unpacked += 1
            if [r.sub_sequence_number for r in out] != list(range(len(out))):
                problems.append(f"{kinesis_record.sequence_number}: sub-sequence numbers")
            for r in out:
                r.hash_key  # noqa: B018 - must not raise
                if not 1 <= len(r.partition_key) <= 256:
                    problems.append(f"{r.position}: partition key of {len(r.partition_key)}")
        else:
            problems.append(f"{kinesis_record.sequence_number}: {len(out)} records came out")
    return plain, unpacked


async def _run(seed: int, count: int) -> Tally:
    intake = RecordIntake(
        plan=resume_filter(ExtendedSequenceNumber(TRIM_HORIZON), None),
        hash_range=HashKeyRange(0, 2**127),
        stream="fuzz",
        shard_id=f"shardId-{seed:012d}",
    )
    fuzzer = iter(AggregateFuzzer(seed))
    problems: list[str] = []
    plain = unpacked = user_records = 0
    sequence = FIRST_SEQUENCE + seed * 10**12
    for start in range(0, count, BATCH):
        batch = [
            Record(
                data=data,
                partition_key="outer",
                sequence_number=str(sequence + start + i),
                shard_id=intake.shard_id,
                stream_name="fuzz",
            )
            for i, data in enumerate(itertools.islice(fuzzer, min(BATCH, count - start)))
        ]
        items: list[Intake] = []
        try:
            async for piece in intake.pieces(batch):
                items.extend(piece)
        except Exception as exc:  # the point of the test: nothing may get here
            problems.append(f"batch at {start}: {type(exc).__name__}: {exc}")
            continue
        batch_plain, batch_unpacked = _check_batch(batch, items, problems)
        plain += batch_plain
        unpacked += batch_unpacked
        user_records += len(items)
    if intake.counts.decode_failures:
        problems.append(f"{intake.counts.decode_failures} records failed to decode unexpectedly")
    return Tally(count, plain, unpacked, user_records, tuple(problems[:20]))


def fuzz(seed: int, count: int) -> Tally:
    logging.disable(logging.CRITICAL)  # a warning per malformed aggregate: hundreds of thousands
    return asyncio.run(_run(seed, count))
