"""A processor's checkpoint requests, answered as the KCL answers them (the driver's rules, on
a stand-in session: no child process, no AWS)."""

from __future__ import annotations

from typing import Any

import pytest

from shardflow.consumer import ConsumedRecord
from shardflow.errors import AwsError, ShardLeaseLost, ThrottledError
from shardflow.multilang.messages import CheckpointRequest
from shardflow.multilang.shard import SHARD_END_POSITION, DriverSettings, ShardDriver
from shardflow.records import ExtendedSequenceNumber
from support.multilang_standins import StandInSession, stand_in_driver


def records(*positions: tuple[int, int]) -> list[ConsumedRecord[Any]]:
    return [ConsumedRecord(b"x", "k", str(seq), sub) for seq, sub in positions]


def driver(*batches: list[ConsumedRecord[Any]], phase: str = "processRecords") -> ShardDriver:
    made = stand_in_driver(StandInSession(), DriverSettings(command=("true",)))
    for batch in batches:
        made._pending.append(batch)
        made._last_record = batch[-1]
        made._largest = batch[-1].position
    made._phase = phase
    return made


def written(made: ShardDriver) -> list[str]:
    return [str(p) for p in made.session.checkpointer.written]  # type: ignore[attr-defined]


async def test_no_sequence_number_checkpoints_at_the_last_record_delivered() -> None:
    made = driver(records((10, 0), (11, 0)), records((12, 0), (12, 1), (12, 2)))
    assert await made._checkpoint(CheckpointRequest(None, None)) is None
    assert written(made) == ["12.2"]
    assert not made._pending  # nothing left to deliver again after a restart


async def test_mid_batch_checkpoints_take_the_record_asked_for_and_keep_the_rest() -> None:
    made = driver(records((10, 0), (11, 0), (12, 0), (12, 1), (13, 0)))
    assert await made._checkpoint(CheckpointRequest("12", 0)) is None  # sub-record 0 only
    assert written(made) == ["12"]
    assert [str(r.position) for batch in made._pending for r in batch] == ["12.1", "13"]
    # A position between two records covers the records before it, as the KCL's does.
    assert await made._checkpoint(CheckpointRequest("12", 5)) is None
    assert written(made) == ["12", "12.1"]
    assert made._last == ExtendedSequenceNumber("12", 5)
    # The same position again writes nothing (the KCL: already the checkpoint).
    assert await made._checkpoint(CheckpointRequest("12", 5)) is None
    assert written(made) == ["12", "12.1"]


@pytest.mark.parametrize(
    "request_",
    [
        CheckpointRequest("14", 0),  # beyond the last record delivered
        CheckpointRequest("9", 0),  # before the last checkpoint
        CheckpointRequest("not-a-number", 0),
        CheckpointRequest("11", -1),
    ],
)
async def test_positions_the_kcl_refuses_are_illegal_arguments(request_: CheckpointRequest) -> None:
    made = driver(records((10, 0), (11, 0), (13, 0)))
    made._last = ExtendedSequenceNumber("10")
    assert await made._checkpoint(request_) == "IllegalArgumentException"
    assert written(made) == []


@pytest.mark.parametrize("phase", ["initialize", "leaseLost"])
async def test_outside_a_checkpointing_action_it_is_an_invalid_state(phase: str) -> None:
    made = driver(records((10, 0)), phase=phase)
    assert await made._checkpoint(CheckpointRequest(None, None)) == "InvalidStateException"


@pytest.mark.parametrize(
    ("failure", "name"),
    [
        (ShardLeaseLost("shardId-000000000000"), "ShutdownException"),
        (
            ThrottledError("slow down", code="ProvisionedThroughputExceededException"),
            "ThrottlingException",
        ),
        (AwsError("boom", code="InternalServerError"), "KinesisClientLibDependencyException"),
    ],
)
async def test_write_failures_are_named_as_the_kcl_names_them(
    failure: Exception, name: str
) -> None:
    made = driver(records((10, 0), (11, 0)))
    made.session.checkpointer.fail_with = failure  # type: ignore[attr-defined]
    assert await made._checkpoint(CheckpointRequest("11", 0)) == name
    assert len(made._pending[0]) == 2  # kept: the processor may be started again with them


async def test_at_the_shards_end_the_last_record_or_no_position_is_shard_end() -> None:
    for request_ in (CheckpointRequest(None, None), CheckpointRequest("11", 0)):
        made = driver(records((10, 0), (11, 0)), phase="shardEnded")
        assert await made._checkpoint(request_) is None
        assert made._last == SHARD_END_POSITION
        assert written(made) == ["11"]  # every record acknowledged: the consumer writes SHARD_END
