"""Once the processor checkpoints a batch, the daemon keeps none of its records (but the last
one delivered) while it waits for the shard's next batch. Before, the shard's first batch
stayed alive as the result of the read started before ``initialize``, for as long as the shard
was owned, and every batch until the next one came (a drain's last batch for good): a
10,000-record batch is ~5 MiB of the daemon's memory (issue 23)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

from shardflow.consumer import ConsumedRecord
from shardflow.multilang.shard import DriverSettings
from support.multilang_standins import StandInSession, stand_in_driver
from support.waiting import until

BATCH = 300

# Answers every action; checkpoints each processRecords batch at its end, as kclpy's
# ``checkpointer.checkpoint()`` does, waiting for the daemon's answer.
CHECKPOINTS_EACH_BATCH = r"""
import json, sys
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action == "processRecords":
        sys.stdout.write(json.dumps({"action": "checkpoint", "sequenceNumber": None}) + "\n")
        sys.stdout.flush()
        sys.stdin.readline()
    sys.stdout.write(json.dumps({"action": "status", "responseFor": action}) + "\n")
    sys.stdout.flush()
"""


class Session(StandInSession):
    """Two batches, then a shard that has nothing more (its next read never answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = self._batches()
        self.reading_third = asyncio.Event()

    async def _batches(self) -> AsyncIterator[list[ConsumedRecord[Any]]]:
        for first in (0, BATCH):
            yield [
                ConsumedRecord(b"x" * 100, "k", str(10**20 + n), shard_id=self.shard_id)
                for n in range(first, first + BATCH)
            ]
        self.reading_third.set()
        await asyncio.Event().wait()
        yield []  # never reached


def alive() -> int:
    gc.collect()
    return sum(1 for thing in gc.get_objects() if isinstance(thing, ConsumedRecord))


async def test_checkpointed_batches_are_let_go_while_the_next_is_awaited() -> None:
    session = Session()
    stopping = asyncio.Event()

    driver = stand_in_driver(
        session,
        DriverSettings(command=(sys.executable, "-c", CHECKPOINTS_EACH_BATCH), shutdown_grace=5.0),
        stopping=stopping,
    )
    run = asyncio.create_task(driver.run())
    try:
        await until(lambda: len(session.checkpointer.written) == 2, 20.0)
        await asyncio.wait_for(session.reading_third.wait(), 5.0)
        for _ in range(10):
            await asyncio.sleep(0)
        assert not driver._pending
        # The last record delivered is kept (a shard end checkpoints at it); nothing else.
        assert alive() == 1
    finally:
        run.cancel()  # the shard's read never ends here (the consumer would end it)
        await asyncio.gather(run, return_exceptions=True)
