"""The shop's event feed: generated orders and payments written through the producer, in waves.

The feed runs in a thread of its own (an asyncio producer on its own loop) while Spark reads,
so the streaming jobs see the data arrive over time rather than all at once. Every event is in
the :class:`~demo.ledger.Ledger` once the producer confirmed it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from datetime import datetime, timedelta

from demo.events import generate_events
from demo.ledger import Ledger
from shardflow.aws import AwsSettings
from shardflow.producer import Producer, ProducerSettings

TICK_AHEAD = timedelta(minutes=10)
"""How far past the last event the closing tick's event time lies (beyond the watermark delay
and the last window, so that every window closes)."""


class Feed:
    """Produces ``events`` events over about ``seconds`` seconds, in ``waves`` waves."""

    def __init__(
        self,
        stream: str,
        aws: AwsSettings,
        *,
        events: int,
        seconds: float,
        waves: int = 40,
        events_per_second: float = 5.0,
    ) -> None:
        self.stream = stream
        self.aws = aws
        self.total = events
        self.seconds = seconds
        self.waves = max(1, min(waves, events))
        self.events_per_second = events_per_second
        self.ledger = Ledger()
        self.kinesis_records = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="demo-feed", daemon=True)

    @property
    def produced(self) -> int:
        with self._lock:
            return self.ledger.events

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """Wait for the feed to finish; True if it did (check :attr:`error`)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the pipeline, which owns the console
            self.error = exc

    async def _produce(self) -> None:
        # Aggregated (fewer, fuller requests) and in per-customer order: a payment never
        # overtakes its order, even across retries.
        settings = ProducerSettings(aggregate=True, preserve_key_order=True, linger=0.02)
        events = list(generate_events(self.total, events_per_second=self.events_per_second))
        per_wave = -(-len(events) // self.waves)
        pause = self.seconds / self.waves
        async with Producer(self.stream, settings=settings, aws=self.aws) as producer:
            for start in range(0, len(events), per_wave):
                began = time.monotonic()
                wave = events[start : start + per_wave]
                futures = await producer.put_many((e.to_bytes(), e.partition_key) for e in wave)
                results = await asyncio.gather(*futures)
                with self._lock:
                    for event in wave:
                        self.ledger.add(event.body)
                    self.kinesis_records += len({(r.shard_id, r.sequence_number) for r in results})
                await asyncio.sleep(max(0.0, pause - (time.monotonic() - began)))


def send_closing_tick(stream: str, aws: AwsSettings, last_event_time: datetime) -> None:
    """Write one ``tick`` event far ahead in event time: the watermark passes every window.

    A streaming aggregate in append mode writes a window only once the watermark passed it,
    and the watermark only moves with data; a shop's clock tick after closing time is that data.
    """
    body = {
        "type": "tick",
        "event_id": str(uuid.uuid4()),
        "ts": (last_event_time + TICK_AHEAD).isoformat(),
    }

    async def put() -> None:
        async with Producer(stream, aws=aws) as producer:
            await (await producer.put(json.dumps(body).encode(), "clock"))

    asyncio.run(put())
