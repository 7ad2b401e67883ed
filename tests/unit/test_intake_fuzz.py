"""A million mutated KPL aggregates through the consumer's intake: not one unexpected exception.

Each mutated aggregate carries a valid MD5, so it reaches the protobuf parser and the field
checks. They go through :class:`~shardflow.consumer.intake.RecordIntake` as GetRecords
batches of 1,000, with a shard hash range (so every user record's hash key is computed), in
two processes (the work splits by seed). Every input must come out: as its user records, or
whole as a plain record; nothing raised, nothing dropped, positions strictly increasing.

``SHARDFLOW_FUZZ_AGGREGATES`` sets how many (default 1,000,000; more for a longer hunt).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from shardflow.consumer.intake import Intake, RecordIntake, Settled
from shardflow.consumer.resume import resume_filter
from shardflow.records import TRIM_HORIZON, ExtendedSequenceNumber, Record
from shardflow.shards import HashKeyRange
from support.aggregate_fuzz import AggregateFuzzer

TOTAL = int(os.environ.get("SHARDFLOW_FUZZ_AGGREGATES", "1000000"))
PROCESSES = 2
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


def _fuzz(seed: int, count: int) -> Tally:
    logging.disable(logging.CRITICAL)  # a warning per malformed aggregate: hundreds of thousands
    return asyncio.run(_run(seed, count))


def test_a_million_mutated_aggregates_pass_intake_without_an_unexpected_exception() -> None:
    shares = [TOTAL // PROCESSES + (i < TOTAL % PROCESSES) for i in range(PROCESSES)]
    with ProcessPoolExecutor(PROCESSES) as pool:
        tallies = list(pool.map(_fuzz, range(1, PROCESSES + 1), shares))
    problems = [problem for tally in tallies for problem in tally.problems]
    assert not problems
    assert (
        sum(t.aggregates for t in tallies) == TOTAL >= 1_000_000
        or "SHARDFLOW_FUZZ_AGGREGATES" in os.environ
    )
    assert sum(t.plain + t.unpacked for t in tallies) == TOTAL
    # The mutations reach both outcomes in quantity: the fuzzing is not vacuous.
    assert sum(t.unpacked for t in tallies) > TOTAL // 20
    assert sum(t.plain for t in tallies) > TOTAL // 2
