"""A task's rows column by column: the same rows deaggregating makes, without the records."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from shardflow.aggregation import deaggregate
from shardflow.aggregation.encode import AggregateBuilder
from shardflow.records import Record
from shardflow.spark.source.arrow import to_record_batch
from shardflow.spark.source.rows import Rows

ARRIVED = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def outer(data: bytes, sequence: int, **more: object) -> Record:
    return Record(
        data=data,
        partition_key="outer",
        sequence_number=str(sequence),
        shard_id="shardId-1",
        stream_name="orders",
        approximate_arrival_timestamp=ARRIVED,
        **more,  # type: ignore[arg-type]
    )


def packed(sequence: int, count: int, *, marked: bool) -> Record:
    builder = AggregateBuilder(resends_out_of_range=marked)
    for i in range(count):
        assert builder.try_add(f"k{i % 3}", f"{sequence}.{i}".encode(), str(i) if i % 2 else None)
    return outer(builder.build().data, sequence)


def test_rows_are_the_records_deaggregating_makes(caplog: pytest.LogCaptureFixture) -> None:
    malformed = outer(b"\xf3\x89\x9a\xc2" + b"not a protobuf" + b"\0" * 16, 4)
    records = [
        packed(1, 5, marked=True),
        outer(b"plain", 2),
        packed(3, 1, marked=False),
        malformed,
    ]
    rows = Rows()
    with caplog.at_level(logging.WARNING, logger="shardflow.aggregation"):
        rows.extend(records, unpack=True)
    expected = [user for record in records for user in deaggregate(record)]
    assert list(rows) == expected
    assert [r.last_sub_sequence_number for r in rows] == [
        r.last_sub_sequence_number for r in expected
    ]
    assert [r.resent_if_out_of_range for r in rows] == [r.resent_if_out_of_range for r in expected]
    assert len(rows) == 5 + 1 + 1 + 1
    assert "malformed" in caplog.text  # delivered plain, with the same WARNING
    as_they_are = Rows()
    as_they_are.extend(records, unpack=False)
    assert list(as_they_are) == records


def test_a_selection_and_its_arrow_batch() -> None:
    rows = Rows()
    rows.extend([packed(1, 4, marked=False)], unpack=True)
    assert [r.sub_sequence_number for r in rows.select(range(1, 3))] == [1, 2]
    assert [r.sub_sequence_number for r in rows.select([0, 3])] == [0, 3]
    batch = to_record_batch(rows, "orders")
    assert batch.num_rows == 4
    assert batch.column("subSequenceNumber").to_pylist() == [0, 1, 2, 3]
    assert batch.column("explicitHashKey").to_pylist() == [None, "1", None, "3"]
    assert set(batch.column("approximateArrivalTimestamp").to_pylist()) == {ARRIVED}
