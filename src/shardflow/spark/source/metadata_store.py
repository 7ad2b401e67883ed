"""The batch-end store: first writer wins, every later attempt reads what the first recorded.

One store per query run (``<metadataPath>/<run id>``). A batch's end for a shard is written
once, by the first attempt that finishes reading the shard, with a write that fails if the
entry exists (a hard link on a file system, ``If-None-Match: *`` on S3, a conditional put on
DynamoDB); every later attempt (a retry, a speculative copy, a replay after a restart) reads
it and stops exactly there.

The three stores differ only in three primitives (read, create-if-absent, delete older
batches); the rules, and the errors that say how to repair a store that is out of step with
the checkpoint, live here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from shardflow.errors import BatchEndConflictError, MetadataOutOfStepError, SourceMetadataError
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_location import (
    MetadataLocation,
    checked_run_id,
    checked_shard_id,
)

FIX_OUT_OF_STEP = (
    "Fix: restart the query with the metadataPath it was started with (the checkpoint and the "
    "metadata belong together), or start it over with a new checkpointLocation (and a "
    "startingPosition where it should resume)."
)


class BatchEndStore(ABC):
    """The batch ends of one query run. Subclasses store opaque JSON texts by (batch, shard)."""

    def __init__(self, location: MetadataLocation, run_id: str) -> None:
        self.location = location
        self.run_id = checked_run_id(run_id)

    # --- primitives ------------------------------------------------------------------------

    @abstractmethod
    def _read(self, batch: int, shard_id: str) -> str | None:
        """The text recorded for (batch, shard), or None."""

    def _read_many(self, batch: int, shard_ids: Sequence[str]) -> dict[str, str | None]:
        """The texts of several shards of a batch (one at a time here; the AWS stores ask
        for them at once: a batch of 256 shards is 256 round trips to S3 or DynamoDB)."""
        return {shard_id: self._read(batch, shard_id) for shard_id in shard_ids}

    @abstractmethod
    def _create(self, batch: int, shard_id: str, text: str) -> bool:
        """Record ``text`` unless an entry exists; True if this call created it."""

    @abstractmethod
    def _delete_before(self, batch: int) -> None:
        """Delete every entry of batches older than ``batch``."""

    @abstractmethod
    def prepare(self) -> None:
        """Check (and create where that is safe) the store, once, on the driver."""

    @property
    def where(self) -> str:
        """The run's place in the store, for messages."""
        return f"{self.location}/{self.run_id}"

    # --- the rules -------------------------------------------------------------------------

    def load(self, batch: int, shard_id: str) -> ShardBatchEnd | None:
        """The recorded end, or None if no attempt finished this shard of this batch yet."""
        return self._parsed(batch, shard_id, self._read(batch, checked_shard_id(shard_id)))

    def load_many(self, batch: int, shard_ids: Sequence[str]) -> dict[str, ShardBatchEnd | None]:
        """:meth:`load` of several shards of one batch, read together."""
        texts = self._read_many(batch, [checked_shard_id(s) for s in shard_ids])
        return {s: self._parsed(batch, s, texts[s]) for s in shard_ids}

    def _parsed(self, batch: int, shard_id: str, text: str | None) -> ShardBatchEnd | None:
        if text is None:
            return None
        try:
            return ShardBatchEnd.from_json(text)
        except (ValueError, KeyError, TypeError) as error:
            raise SourceMetadataError(
                f"unreadable end of shard {shard_id} in batch {batch} under {self.where}: {error}"
            ) from error

    def record_first(self, batch: int, shard_id: str, end: ShardBatchEnd) -> ShardBatchEnd:
        """Record ``end`` unless an end is recorded already; returns the one that holds."""
        if self._create(batch, checked_shard_id(shard_id), end.to_json()):
            return end
        held = self.load(batch, shard_id)
        if held is None:
            raise SourceMetadataError(
                f"the end of shard {shard_id} in batch {batch} under {self.where} exists but "
                "could not be read back"
            )
        return held

    def record_or_conflict(self, batch: int, shard_id: str, mine: ShardBatchEnd) -> None:
        """Record ``mine``; raise :class:`BatchEndConflictError` if another attempt recorded a
        different end first (this attempt then handed out different records and must fail)."""
        held = self.record_first(batch, shard_id, mine)
        if (held.end, held.rows) != (mine.end, mine.rows):
            raise BatchEndConflictError(
                shard_id=shard_id, batch=batch, recorded=held.end, read=mine.end
            )

    def require(self, batch: int, shard_id: str) -> ShardBatchEnd:
        """The recorded end of a batch that completed; raises if the store does not have it."""
        return self._required(batch, shard_id, self.load(batch, shard_id))

    def require_many(self, batch: int, shard_ids: Sequence[str]) -> dict[str, ShardBatchEnd]:
        """:meth:`require` of several shards of one batch, read together."""
        found = self.load_many(batch, shard_ids)
        return {s: self._required(batch, s, found[s]) for s in shard_ids}

    def _required(self, batch: int, shard_id: str, end: ShardBatchEnd | None) -> ShardBatchEnd:
        if end is None:
            raise MetadataOutOfStepError(
                f"the checkpoint says batch {batch} read shard {shard_id}, but {self.where} "
                "holds no end for it: the metadataPath was changed, cleaned, restored from "
                "another time, or (a directory) is not shared with the executors. "
                + FIX_OUT_OF_STEP
            )
        return end

    def check_start(self, batch: int, shard_id: str, start: str, recorded: ShardBatchEnd) -> None:
        """Fail if ``recorded`` was written by a batch that started elsewhere than ``start``."""
        if recorded.start is not None and recorded.start != start:
            raise MetadataOutOfStepError(
                f"batch {batch}, shard {shard_id}: the checkpoint starts it at {start}, but the "
                f"end recorded under {self.where} belongs to a batch that started at "
                f"{recorded.start}. " + FIX_OUT_OF_STEP
            )

    def forget_before(self, batch: int) -> None:
        """Delete the ends of batches older than ``batch`` (they are never replayed again)."""
        self._delete_before(batch)


def batch_name(batch: int) -> str:
    """A batch number as a fixed-width name: names sort as numbers do."""
    return f"{batch:012d}"
