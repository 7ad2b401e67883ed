"""Positions, offsets, budgets, lineage and the batch-end store of the Spark source."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from shardflow.errors import MetadataOutOfStepError, SourceMetadataError
from shardflow.spark.source.admission import shard_budgets
from shardflow.spark.source.lineage import readable_shards
from shardflow.spark.source.metadata import DataLoss, ShardBatchEnd
from shardflow.spark.source.offsets import UNLIMITED, SourceOffset
from shardflow.spark.source.positions import Kind, ShardPosition, parse_user_position
from support.batch_end_race import RUN, local_store, race

END = ShardPosition.shard_end()
TRIM = ShardPosition.trim_horizon()


@pytest.mark.parametrize(
    "position",
    [
        TRIM,
        END,
        ShardPosition.at_timestamp_ms(1714564800000),
        ShardPosition.at("12"),
        ShardPosition.after("12"),
        ShardPosition.after("12", 3),
    ],
)
def test_positions_round_trip_as_text(position: ShardPosition) -> None:
    assert ShardPosition.from_text(position.to_text()) == position


def test_after_reads_at_the_record_and_skips_up_to_it() -> None:
    whole, partial = ShardPosition.after("12"), ShardPosition.after("12", 3)
    assert whole.iterator_start().sequence_number == "12"
    assert whole.skips("12", 7)
    assert not whole.skips("13", 0)
    assert partial.skips("12", 3)
    assert not partial.skips("12", 4)
    assert not ShardPosition.at("12").skips("12", 0)


@pytest.mark.parametrize("text", ["AFTER:x", "AT:", "AFTER:1/x", "NOWHERE", "AT_TIMESTAMP:soon"])
def test_malformed_position_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a"):
        ShardPosition.from_text(text)


def test_user_positions() -> None:
    assert parse_user_position("99") == ShardPosition.after("99")
    assert parse_user_position("at_sequence_number:99") == ShardPosition.at("99")
    assert parse_user_position("AT_TIMESTAMP:2024-05-01T12:00:00") == (
        ShardPosition.at_timestamp_ms(1714564800000)
    )
    with pytest.raises(ValueError, match="expected TRIM_HORIZON"):
        parse_user_position("AFTER:abc")


def test_offsets_are_stable_json_and_round_trip() -> None:
    offset = SourceOffset(
        run="r1",
        batch=3,
        shards={"b": END, "a": ShardPosition.after("5", 1)},
        read={"a": 10},
        until_ms=7,
        data_loss_events=1,
        data_lost={"a": "after AT:1"},
    )
    raw = offset.to_dict()
    assert list(raw) == sorted(raw)
    assert list(raw["shards"]) == ["a", "b"]
    assert SourceOffset.from_dict(json.loads(json.dumps(raw))) == offset
    with pytest.raises(SourceMetadataError, match="not an offset"):
        SourceOffset.from_dict({"v": 1, "batch": 0})


def test_budgets_share_the_trigger_limit_and_respect_the_shard_cap() -> None:
    assert shard_budgets(["b", "a", "c"], 10, None, 0) == {"a": 4, "b": 3, "c": 3}
    assert shard_budgets(["a", "b"], None, None, 0) == {"a": UNLIMITED, "b": UNLIMITED}
    assert shard_budgets(["a", "b"], None, 5, 0) == {"a": 5, "b": 5}
    assert shard_budgets(["a", "b"], 100, 7, 0) == {"a": 7, "b": 7}
    # Fewer rows than shards: the shards that get one rotate with the batch.
    assert shard_budgets(["a", "b", "c"], 2, None, 0) == {"a": 1, "b": 1}
    assert shard_budgets(["a", "b", "c"], 2, None, 1) == {"b": 1, "c": 1}
    assert shard_budgets([], 5, None, 0) == {}


def test_children_wait_for_every_parent() -> None:
    parents = {"child": ("p1", "p2"), "p1": (), "p2": ()}
    positions = {"p1": END, "p2": ShardPosition.after("9"), "child": TRIM}
    assert readable_shards(positions, parents) == ["p2"]
    assert readable_shards({**positions, "p2": END}, parents) == ["child"]
    # A parent gone from the stream (expired) no longer holds its child back.
    assert readable_shards({"child": TRIM}, parents) == ["child"]


def test_the_first_recorded_end_holds_for_every_attempt(tmp_path: Path) -> None:
    # Fresh interpreters, not forks: a fork of this process inherits what earlier tests left in
    # it. After the Spark sink's tests, the pooled producers' exit hooks ran in every forked
    # racer and waited for loop threads a fork does not copy: 65 s in the full suite.
    spawn = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[str] = spawn.Queue()
    start = spawn.Barrier(6)
    racers = [spawn.Process(target=race, args=(str(tmp_path), i, start, results)) for i in range(6)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    seen = {results.get(timeout=5) for _ in racers}
    store = local_store(str(tmp_path))
    held = store.require(4, "shardId-0")
    assert seen == {held.end}
    assert [p.name for p in (tmp_path / RUN / "000000000004").iterdir()] == ["shardId-0.json"]


def test_store_round_trip_missing_and_cleanup(tmp_path: Path) -> None:
    store = local_store(str(tmp_path))
    end = ShardBatchEnd(end="SHARD_END", rows=3, stopped="end", lost=DataLoss("AFTER:1", None))
    for batch in range(5):
        store.record_first(batch, "s", end)
    assert store.load(4, "s") == end
    assert end.shard_ended
    assert end.position.kind is Kind.SHARD_END
    assert store.load(9, "s") is None
    with pytest.raises(MetadataOutOfStepError, match=r"holds no end for it.*Fix: restart"):
        store.require(9, "s")
    store.forget_before(3)
    assert sorted(p.name for p in store.root.iterdir()) == ["000000000003", "000000000004"]
    (store.root / "000000000004" / "s.json").write_text("{broken")
    with pytest.raises(SourceMetadataError, match="unreadable"):
        store.load(4, "s")
