"""What the S3 and DynamoDB batch-end stores share: an open client of this thread's loop, calls
retried while the service answers errors that pass (500s, 503 SlowDown, throttling, dropped
connections), and AWS errors turned into :class:`SourceMetadataError` that say where and what
to do."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from shardflow.aws.classify import classify
from shardflow.aws.clients import Service
from shardflow.backoff import Backoff
from shardflow.errors import SourceMetadataError
from shardflow.spark.source.metadata_store import BatchEndStore
from shardflow.spark.source.runtime import runner

T = TypeVar("T")

# Reads of batch ends in flight at once (the driver reads every shard's end after a batch;
# a task those of its shards).
_READS_AT_ONCE = 32
# The stores' clients leave retrying to shardflow (sdk_max_attempts=1), so the store does it:
# S3 and DynamoDB answer 500s and throttle now and then, and a failed read or write here fails
# the task or, on the driver, the whole query. Pauses of up to 2 s, about 10-15 s in all.
_STORE_BACKOFF = Backoff(base=0.1, cap=2.0, max_attempts=10)


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", "error"))


class AwsBatchEnds(BatchEndStore):
    """A store on an AWS service; subclasses name it and the fixes of its common errors."""

    service: ClassVar[Service]
    hints: ClassVar[Mapping[str, str]]

    def _run(self, what: str, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work(client)`` on this thread's loop, errors turned into SourceMetadataError."""
        client = runner().client(self.service, self.location.aws)
        try:
            return runner().run(self._retried(what, work, client))
        except ClientError as error:
            code = error_code(error)
            hint = self.hints.get(code)
            raise SourceMetadataError(
                f"{what} {self.where}: {code}" + (f"; {hint}" if hint else f" ({error})")
            ) from error
        except BotoCoreError as error:
            raise SourceMetadataError(f"{what} {self.where}: {error}") from error

    async def _retried(self, what: str, work: Callable[[Any], Awaitable[T]], client: Any) -> T:
        """``work(client)``, again after an AWS error that passes (classified retryable), with
        jittered backoff; other errors, and the last one, are raised as they are. Every unit of
        work is safe to repeat: reads, deletes, and conditional puts whose loser reads the
        winner's end (a put that was written but answered 500 finds its own end)."""
        attempt = 0
        while True:
            try:
                return await work(client)
            except (ClientError, BotoCoreError) as exc:
                attempt += 1
                error = classify(exc, operation=what)
                if not error.retryable or not _STORE_BACKOFF.allows(attempt):
                    raise
                await asyncio.sleep(_STORE_BACKOFF.delay(attempt - 1))

    def _read_many(self, batch: int, shard_ids: Sequence[str]) -> dict[str, str | None]:
        async def all_of(client: Any) -> dict[str, str | None]:
            gate = asyncio.Semaphore(_READS_AT_ONCE)

            async def one(shard_id: str) -> str | None:
                async with gate:
                    return await self._get_text(client, batch, shard_id)

            texts = await asyncio.gather(*(one(s) for s in shard_ids))
            return dict(zip(shard_ids, texts, strict=True))

        return self._run("reading batch ends from", all_of)

    @abstractmethod
    async def _get_text(self, client: Any, batch: int, shard_id: str) -> str | None:
        """The text recorded for (batch, shard), or None, with this thread's open client."""
