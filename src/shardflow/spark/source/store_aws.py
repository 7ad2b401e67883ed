"""What the S3 and DynamoDB batch-end stores share: an open client of this thread's loop, and
AWS errors turned into :class:`SourceMetadataError` that say where and what to do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from shardflow.aws.clients import Service
from shardflow.errors import SourceMetadataError
from shardflow.spark.source.metadata_store import BatchEndStore
from shardflow.spark.source.runtime import runner

T = TypeVar("T")


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
