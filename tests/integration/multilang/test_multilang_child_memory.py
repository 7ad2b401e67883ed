"""The processor's memory does not depend on how the daemon writes its lines: a kclpy processor
fed ``processRecords`` through :class:`ChildProcess` (encoded 500 records at a time) ends a
drain no larger than one handed each line whole, as the KCL hands it. No AWS: the processor
is the bench's kclpy processor, the records are made in-process."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardflow.consumer.checkpointing.acks import build_undelivered
from shardflow.fetch.batch import records_from_kinesis
from shardflow.multilang import messages
from shardflow.multilang.child import ChildProcess
from shardflow.multilang.messages import CheckpointRequest, Status
from support.multilang import RECORDING, kclpy_or_skip

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")

BATCHES = (10_000, 10_000, 5_000)  # a shard of 25,000 records at maxRecords 10,000


def batch(size: int) -> list[object]:
    arrival = datetime.now(UTC)
    raws = [
        {
            "Data": (f"{i:010d}|" + "x" * 89).encode(),
            "PartitionKey": f"pk-{i % 10_007}",
            "SequenceNumber": str(49668 * 10**51 + i * 1000),
            "ApproximateArrivalTimestamp": arrival,
        }
        for i in range(size)
    ]
    built: list[object] = records_from_kinesis(
        raws, shard_id="shardId-000000000000", stream_name="s", build=build_undelivered
    )
    return built


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(s.split()[1]) for s in status.splitlines() if s.startswith("VmRSS")) / 1024


async def processor_rss(python: Path, out: Path, *, whole: bool) -> float:
    """MiB of RSS of a kclpy processor after BATCHES, each line written whole or as the
    daemon writes it."""
    command = [str(python), str(RECORDING), "--out", str(out), "--worker", "w1"]
    child = ChildProcess(command, shard_id="shardId-000000000000")
    await child.start()

    async def exchange(message: bytes | object) -> None:
        await child.send(message)  # type: ignore[arg-type]
        while True:
            answer = await child.receive(60)
            if isinstance(answer, CheckpointRequest):
                await child.send(messages.checkpoint_answer(answer, None))
            elif isinstance(answer, Status):
                return

    try:
        await exchange(messages.initialize("shardId-000000000000", None))
        for size in BATCHES:
            records = batch(size)
            line = (
                messages.process_records(records, 0)  # type: ignore[arg-type]
                if whole
                else messages.process_records_pieces(records, 0)  # type: ignore[arg-type]
            )
            await exchange(line)
        assert child.pid is not None
        return rss_mib(child.pid)
    finally:
        await child.close(5.0)


@pytest.mark.skipif(sys.platform != "linux", reason="Linux /proc")
def test_a_processor_fed_in_pieces_ends_no_larger_than_one_fed_whole_lines(
    tmp_path: Path,
) -> None:
    python = kclpy_or_skip()
    # Each the smaller of two runs: a processor's RSS after the same input is 21.8 or 22.8 MiB
    # from run to run. Written a piece at a time (the pipe drained before the next), 24.3.
    whole = min(
        asyncio.run(processor_rss(python, tmp_path / f"whole{i}", whole=True)) for i in range(2)
    )
    pieces = min(
        asyncio.run(processor_rss(python, tmp_path / f"pieces{i}", whole=False)) for i in range(2)
    )
    assert pieces <= whole + 1.2, (pieces, whole)
