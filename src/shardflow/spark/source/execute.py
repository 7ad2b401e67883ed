"""The executor side: one task reads its shards (side by side) into Arrow record batches.

Streaming tasks first look for the end their batch recorded for each shard: if an earlier
attempt recorded one, this attempt reads exactly up to it; otherwise it reads fresh and
records where it stopped, unless another attempt was first, in which case it fails if it
handed out different records (Spark retries it, and the retry reads the recorded ones). A
shard's end is recorded as soon as all of its rows were handed to Spark, shard by shard: a
retry of a task that failed half-way reads the finished shards up to their recorded ends
and the others fresh.

The cyclic garbage collector is paused while a fetched batch is unpacked into records and
turned into Arrow: a 1 MiB aggregate of small records makes tens of thousands of records at
once, and the collections their allocation triggers (each older one walking every object of
a worker that imported pyspark, pyarrow and botocore) took a fifth of the task. The records
hold no cycles: reference counting frees them as soon as their Arrow batch is made.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from shardflow.spark.source.arrow import to_record_batch
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.partition import ShardPartition
from shardflow.spark.source.runtime import runner
from shardflow.spark.source.shard_read import ShardRead, fetcher_factory
from shardflow.spark.source.side_by_side import Done, interleave
from shardflow.spark.source.stores import open_store


def read_partition(partition: ShardPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one task, as record batches with the exact schema Spark expects."""
    slot = partition.slot
    store = None if slot is None else open_store(slot.metadata, slot.run_id)
    loop = runner()
    reads: list[ShardRead] = []
    recorded: list[ShardBatchEnd | None] = []
    # The ends earlier attempts recorded for this task's shards, read together.
    ends = (
        {}
        if store is None or slot is None
        else store.load_many(slot.batch, [plan.shard_id for plan in partition.plans])
    )
    for plan in partition.plans:
        found = ends.get(plan.shard_id)
        if store is not None and slot is not None and found is not None:
            store.check_start(slot.batch, plan.shard_id, plan.start.to_text(), found)
            plan = dataclasses.replace(plan, until=found.position, budget=None, cutoff_ms=None)
        kinesis = loop.kinesis(partition.aws, fanout=plan.consumer_arn is not None)
        reads.append(ShardRead(plan, fetcher_factory(plan, kinesis)))
        recorded.append(found)
    chunks = loop.iterate(interleave([read.chunks() for read in reads]))
    while True:
        with _collector_paused():
            item = next(chunks, None)
            if item is None:
                break
            index, chunk = item
            del item
            batch = (
                None
                if isinstance(chunk, Done)
                else to_record_batch(chunk, reads[index].plan.stream_label)
            )
            del chunk
        if batch is not None:
            yield batch
            continue
        # Every row of shard ``index`` was handed out: its end can be recorded.
        if store is None or slot is None or recorded[index] is not None:
            continue
        mine = reads[index].outcome
        assert mine is not None
        store.record_or_conflict(slot.batch, reads[index].plan.shard_id, mine)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (as it was before, after it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
