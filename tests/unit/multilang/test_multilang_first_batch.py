"""The shard is read while its processor starts: the first GetRecords is not held back until
the processor answers ``initialize`` (the KCL starts its prefetch before initialize too)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from shardflow.consumer import ConsumedRecord
from shardflow.multilang.shard import DriverSettings
from support.multilang_standins import StandInSession, stand_in_driver

# A processor that takes its time over initialize, answers every action, and says (on stderr,
# which the daemon logs) when it answered initialize.
SLOW_START = r"""
import json, sys, time
for line in sys.stdin:
    action = json.loads(line)["action"]
    if action == "initialize":
        time.sleep(0.5)
    sys.stdout.write(json.dumps({"action": "status", "responseFor": action}) + "\n")
    sys.stdout.flush()
"""


class Session(StandInSession):
    def __init__(self) -> None:
        super().__init__()
        self.first_asked: float | None = None
        self.batches = self._batches()

    async def _batches(self) -> AsyncIterator[list[ConsumedRecord[Any]]]:
        self.first_asked = time.monotonic()
        yield [ConsumedRecord(b"x", "k", "1")]


async def test_the_first_batch_is_asked_for_before_the_processor_answers_initialize() -> None:
    session = Session()
    stopping = asyncio.Event()
    initialized: list[float] = []

    made = stand_in_driver(
        session,
        DriverSettings(command=(sys.executable, "-c", SLOW_START), shutdown_grace=5.0),
        stopping=stopping,
    )
    exchange = made._exchange

    async def timed(message: Any, action: str) -> None:
        await exchange(message, action)
        if action == "initialize":
            initialized.append(time.monotonic())

    made._exchange = timed  # type: ignore[method-assign]
    stopping.set()  # after the one batch: shutdownRequested, then the processor ends
    await asyncio.wait_for(made.run(), 30)
    assert initialized, "the processor was never initialized"
    assert session.first_asked is not None
    # Asked for while the processor was still starting (it takes 0.5 s over initialize).
    assert session.first_asked < initialized[0] - 0.3
    assert made._last_record is not None  # and the batch went to the processor
