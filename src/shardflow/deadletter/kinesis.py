"""Dead letters on a Kinesis stream (a DLQ stream), written through shardflow's producer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.deadletter.model import DeadLetter
from shardflow.errors import DeadLetterWriteError, ShardflowError
from shardflow.producer import Producer, ProducerSettings, PutResult

DEFAULT_DLQ_PRODUCER: Final = ProducerSettings(linger=0.0, preserve_key_order=True)
"""No lingering (a write waits for its letters anyway); letters of one key land in order."""


class KinesisDestination:
    """Puts each dead letter (its JSON encoding) on ``stream``, keyed by its original partition key.

    Letters of one partition key therefore share a DLQ shard, in the order they were written
    (``preserve_key_order`` is on by default). ``write`` returns only once Kinesis accepted
    every letter; otherwise it raises DeadLetterWriteError. Aggregation is refused: a DLQ is
    read by tools that expect one letter per record. The producer starts on the first write
    (or :meth:`start`), so a missing stream fails a write, not the constructor.
    """

    def __init__(
        self,
        stream: str,
        *,
        aws: AwsSettings | None = None,
        clients: ClientFactory | None = None,
        settings: ProducerSettings | None = None,
    ) -> None:
        settings = settings or DEFAULT_DLQ_PRODUCER
        if settings.aggregate:
            raise ValueError("a dead-letter stream takes one letter per record: aggregate=False")
        self.stream = stream
        self._settings = settings
        self._clients = clients or ClientFactory(aws)
        self._producer: Producer | None = None
        self._starting = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"KinesisDestination({self.stream!r})"

    async def start(self) -> None:
        """Start the producer now (lists the stream's shards: a wrong name fails here)."""
        try:
            await self._running()
        except _Closed:
            raise DeadLetterWriteError(self._where, 0, "destination is closed") from None

    async def _running(self) -> Producer:
        async with self._starting:
            if self._closed:
                raise _Closed
            if self._producer is None:
                producer = Producer(self.stream, settings=self._settings, clients=self._clients)
                await producer.start()
                self._producer = producer
            return self._producer

    @property
    def _where(self) -> str:
        return f"stream {self.stream}"

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        records = [(letter.to_bytes(), letter.partition_key) for letter in letters]
        # Check sizes before anything is put: a letter too large for a record fails the
        # whole write up front instead of after its predecessors went out.
        limit = self._settings.max_record_bytes
        for letter, (payload, key) in zip(letters, records, strict=True):
            size = len(payload) + len(key.encode())
            if size > limit:
                raise DeadLetterWriteError(
                    self._where,
                    len(letters),
                    f"letter of {letter.origin} encodes to {size} bytes, over the record "
                    f"limit of {limit} bytes",
                )
        try:
            producer = await self._running()
            futures = await producer.put_many(records)
            await producer.flush()
            results = await asyncio.gather(*futures, return_exceptions=True)
        except _Closed:
            raise DeadLetterWriteError(self._where, len(letters), "destination is closed") from None
        except ShardflowError as exc:
            raise DeadLetterWriteError(self._where, len(letters), str(exc)) from exc
        _raise_for_failures(self._where, results)

    async def close(self) -> None:
        async with self._starting:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.close()


class _Closed(Exception):
    """The destination was closed before the write began."""


def _raise_for_failures(where: str, results: Sequence[PutResult | BaseException]) -> None:
    failures = [r for r in results if isinstance(r, BaseException)]
    if not failures:
        return
    first = failures[0]
    error = DeadLetterWriteError(
        where,
        len(results),
        f"{len(failures)} of {len(results)} letters not accepted; first: {first}",
    )
    raise error from first
