"""One shard's read for a Spark task, over a scripted fetcher (no AWS involved)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from shardflow.aggregation import aggregate
from shardflow.aggregation.encode import AggregateBuilder
from shardflow.errors import DataLossError
from shardflow.fetch.batch import FetchedBatch
from shardflow.positions import StartPosition
from shardflow.records import Record
from shardflow.shards import HashKeyRange
from shardflow.spark.source.positions import ShardPosition
from shardflow.spark.source.shard_read import ShardRead, ShardReadPlan


def plain(seq: int, arrived_ms: int = 0) -> Record:
    return Record(
        data=f"d{seq}".encode(),
        partition_key="k",
        sequence_number=str(seq),
        shard_id="s",
        approximate_arrival_timestamp=datetime.fromtimestamp(arrived_ms / 1000, UTC),
    )


def aggregated(seq: int, count: int) -> Record:
    (packed,) = aggregate([("k", f"d{seq}.{i}".encode(), None) for i in range(count)])
    return Record(data=packed.data, partition_key="k", sequence_number=str(seq), shard_id="s")


def marked(seq: int, hash_keys: list[int]) -> Record:
    """An aggregate of shardflow's producer (re-send mark set): sub-record i has hash key
    ``hash_keys[i]``."""
    builder = AggregateBuilder(resends_out_of_range=True)
    for i, hash_key in enumerate(hash_keys):
        assert builder.try_add("k", f"d{seq}.{i}".encode(), str(hash_key))
    packed = builder.build()
    return Record(
        data=packed.data,
        partition_key=packed.partition_key,
        explicit_hash_key=packed.explicit_hash_key,
        sequence_number=str(seq),
        shard_id="s",
    )


class Script:
    """A shard of ``records`` served as fetched batches of ``size`` from where it is asked."""

    def __init__(self, records: list[Record], *, size: int = 2, ended: bool = False) -> None:
        self.records = records
        self.size = size
        self.ended = ended
        self.starts: list[StartPosition] = []
        self.served = 0

    def __call__(self, start: StartPosition, limit: int) -> AsyncIterator[FetchedBatch]:
        self.starts.append(start)
        return self._serve(start, min(limit, self.size))

    async def _serve(self, start: StartPosition, size: int) -> AsyncIterator[FetchedBatch]:
        rest = self.records
        if start.sequence_number is not None:
            rest = [r for r in rest if int(r.sequence_number) >= int(start.sequence_number)]
        while True:
            batch, rest = rest[:size], rest[size:]
            last = not rest and self.ended
            self.served += 1
            yield FetchedBatch(
                "s", batch, millis_behind_latest=0 if not rest else 1, shard_ended=last
            )
            if last:
                return


async def run(plan: ShardReadPlan, script: Script) -> tuple[list[str], ShardRead]:
    read = ShardRead(plan, script)
    rows = [
        f"{r.sequence_number}/{r.sub_sequence_number}"
        async for chunk in read.chunks()
        for r in chunk
    ]
    return rows, read


def plan(start: ShardPosition, **more: object) -> ShardReadPlan:
    return ShardReadPlan(stream="st", stream_label="st", shard_id="s", start=start, **more)  # type: ignore[arg-type]


async def test_a_fresh_read_skips_the_start_record_and_stops_at_its_budget() -> None:
    script = Script([plain(i) for i in range(1, 8)])
    rows, read = await run(plan(ShardPosition.after("2"), budget=3), script)
    assert rows == ["3/0", "4/0", "5/0"]
    assert read.outcome is not None
    assert (read.outcome.end, read.outcome.rows, read.outcome.stopped) == ("AFTER:5", 3, "budget")
    assert script.starts[0].sequence_number == "2"  # read AT the record to see it is still there


async def test_the_tip_and_the_shard_end() -> None:
    rows, read = await run(plan(ShardPosition.trim_horizon()), Script([plain(1), plain(2)]))
    assert rows == ["1/0", "2/0"]
    assert read.outcome is not None
    assert read.outcome.stopped == "tip"
    rows, read = await run(plan(ShardPosition.after("2")), Script([plain(2)], ended=True))
    assert rows == []
    assert read.outcome is not None
    assert read.outcome.end == "SHARD_END"


async def test_a_budget_may_end_inside_an_aggregate_and_the_next_read_goes_on_there() -> None:
    records = [aggregated(10, 4), aggregated(11, 4)]
    rows, read = await run(plan(ShardPosition.trim_horizon(), budget=3), Script(records))
    assert rows == ["10/0", "10/1", "10/2"]
    assert read.outcome is not None
    assert read.outcome.end == "AFTER:10/2"
    rows, read = await run(plan(ShardPosition.after("10", 2), budget=3), Script(records))
    assert rows == ["10/3", "11/0", "11/1"]


async def test_a_replay_stops_exactly_at_the_recorded_end() -> None:
    script = Script([plain(i) for i in range(1, 9)])
    rows, _ = await run(plan(ShardPosition.after("1"), until=ShardPosition.after("4")), script)
    assert rows == ["2/0", "3/0", "4/0"]
    rows, _ = await run(plan(ShardPosition.after("1"), until=ShardPosition.after("1")), script)
    assert rows == []
    assert len(script.starts) == 1  # nothing to read: not even an iterator


async def test_a_cutoff_leaves_out_records_that_arrived_later() -> None:
    script = Script([plain(1, 100), plain(2, 200), plain(3, 300)])
    rows, read = await run(plan(ShardPosition.trim_horizon(), cutoff_ms=250), script)
    assert rows == ["1/0", "2/0"]
    assert read.outcome is not None
    assert read.outcome.stopped == "cutoff"


async def test_a_vanished_start_record_is_data_loss() -> None:
    script = Script([plain(5), plain(6)])  # record 3 expired
    with pytest.raises(DataLossError, match="read up to AFTER:3") as caught:
        await run(plan(ShardPosition.after("3")), script)
    assert caught.value.resumed_at == "5"
    rows, read = await run(plan(ShardPosition.after("3"), fail_on_data_loss=False), script)
    assert rows == ["5/0", "6/0"]
    assert read.outcome is not None
    assert read.outcome.lost is not None
    assert read.outcome.lost.resumed_at == "5"


LOW = HashKeyRange(0, 99)


async def test_sub_records_resent_to_another_shard_are_skipped_and_the_end_moves_past_them() -> (
    None
):
    # After a split the producer's aggregate for the parent landed on the child holding 0-99:
    # the sub-records with keys >= 100 were put again on the other child.
    records = [marked(10, [5, 150, 7]), marked(11, [120, 130]), plain(12)]
    rows, read = await run(plan(ShardPosition.trim_horizon(), hash_range=LOW), Script(records))
    assert rows == ["10/0", "10/2", "12/0"]
    assert read.outcome is not None
    assert (read.outcome.end, read.outcome.rows) == ("AFTER:12", 3)
    # A read whose last records are all skipped still moves its end past them.
    rows, read = await run(
        plan(ShardPosition.after("10"), hash_range=LOW), Script(records[:2], size=1)
    )
    assert rows == []
    assert read.outcome is not None
    assert (read.outcome.end, read.outcome.rows, read.outcome.stopped) == ("AFTER:11", 0, "tip")
    # A replay up to a recorded end on a skipped sub-record stops there.
    rows, _ = await run(
        plan(ShardPosition.trim_horizon(), until=ShardPosition.after("10", 1), hash_range=LOW),
        Script(records),
    )
    assert rows == ["10/0"]


async def test_out_of_range_sub_records_without_the_mark_or_the_range_are_delivered() -> None:
    (packed,) = aggregate([("k", b"a", "5"), ("k", b"b", "150")])
    unmarked = Record(
        data=packed.data,
        partition_key=packed.partition_key,
        explicit_hash_key=packed.explicit_hash_key,
        sequence_number="10",
        shard_id="s",
    )
    rows, _ = await run(plan(ShardPosition.trim_horizon(), hash_range=LOW), Script([unmarked]))
    assert rows == ["10/0", "10/1"]  # another producer never re-sends: nothing may be lost
    rows, _ = await run(plan(ShardPosition.trim_horizon()), Script([marked(10, [5, 150])]))
    assert rows == ["10/0", "10/1"]


async def test_the_next_batch_is_asked_for_ahead_only_while_more_is_wanted() -> None:
    script = Script([plain(i) for i in range(1, 8)])
    rows, _ = await run(plan(ShardPosition.trim_horizon(), budget=3), script)
    assert rows == ["1/0", "2/0", "3/0"]
    assert script.served == 2  # the budget was reached in the second batch: no third one
    script = Script([plain(i) for i in range(1, 6)])
    rows, read = await run(plan(ShardPosition.trim_horizon()), script)
    assert len(rows) == 5
    assert read.outcome is not None
    assert read.outcome.stopped == "tip"
    assert script.served == 3  # [1, 2] [3, 4] [5]: the last one is at the tip


async def test_a_cutoff_inside_an_aggregate_read_again_leaves_out_its_other_sub_records() -> None:
    late = aggregated(10, 4)
    late = Record(
        data=late.data,
        partition_key="k",
        sequence_number="10",
        shard_id="s",
        approximate_arrival_timestamp=datetime.fromtimestamp(0.3, UTC),
    )
    script = Script([late, plain(11, 400)])
    rows, read = await run(plan(ShardPosition.after("10", 1), cutoff_ms=250), script)
    assert rows == []
    assert read.outcome is not None
    assert (read.outcome.stopped, read.outcome.end) == ("cutoff", "AFTER:10/1")
    rows, read = await run(plan(ShardPosition.trim_horizon(), cutoff_ms=350), script)
    assert rows == ["10/0", "10/1", "10/2", "10/3"]
    assert read.outcome is not None
    assert (read.outcome.stopped, read.outcome.end) == ("cutoff", "AFTER:10")
