"""What the S3 and DynamoDB batch-end stores share: an open client of this thread's loop, and
AWS errors turned into :class:`SourceMetadataError` that say where and what to do."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from shardflow.aws.clients import Service
from shardflow.errors import SourceMetadataError
from shardflow.spark.source.metadata_store import BatchEndStore
from shardflow.spark.source.runtime import runner

T = TypeVar("T")

# Reads of batch ends in flight at once (the driver reads every shard's end after a batch;
# a task those of its shards).
_READS_AT_ONCE = 32


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
            return runner().run(work(client))
        except ClientError as error:
            code = error_code(error)
            hint = self.hints.get(code)
            raise SourceMetadataError(
                f"{what} {self.where}: {code}" + (f"; {hint}" if hint else f" ({error})")
            ) from error
        except BotoCoreError as error:
            raise SourceMetadataError(f"{what} {self.where}: {error}") from error

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
