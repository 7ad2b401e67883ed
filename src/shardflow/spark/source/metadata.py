"""Where each micro-batch ended, per shard: the record that makes replays read the same records.

Layout: ``<metadataPath>/<run id>/<batch, 12 digits>/<shard id>.json``. The run id comes from
the query's first offset, so a new query (new checkpoint) never sees an old query's ends.

A batch's end for a shard is written once: the first attempt that finishes reading the shard
creates the file atomically (``os.link`` of a complete temporary file fails if the name
exists), and every later attempt (retry, speculative copy, replay after a restart) reads it
and stops exactly there. A local or shared (NFS) file system is what this needs.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from shardflow.errors import SourceMetadataError
from shardflow.spark.source.positions import Kind, ShardPosition

StopReason = Literal["tip", "budget", "cutoff", "end", "until"]


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Records skipped because they were gone: after ``after``, up to ``resumed_at``."""

    after: str
    resumed_at: str | None


@dataclass(frozen=True, slots=True)
class ShardBatchEnd:
    """How reading one shard in one micro-batch ended.

    ``end`` is where the next batch starts (``SHARD_END`` once the shard is fully read);
    ``rows`` how many rows the batch held; ``stopped`` why reading stopped (``budget`` means
    more records are known to wait); ``lost`` any records found missing.
    """

    end: str
    rows: int
    stopped: StopReason
    lost: DataLoss | None = None

    @property
    def position(self) -> ShardPosition:
        return ShardPosition.from_text(self.end)

    @property
    def shard_ended(self) -> bool:
        return self.position.kind is Kind.SHARD_END

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShardBatchEnd:
        raw: dict[str, Any] = json.loads(text)
        lost = raw.get("lost")
        return cls(
            end=str(raw["end"]),
            rows=int(raw["rows"]),
            stopped=raw["stopped"],
            lost=DataLoss(**lost) if lost else None,
        )


class BatchEndStore:
    """The batch ends of one query run under ``root`` (``<metadataPath>/<run id>``)."""

    def __init__(self, metadata_path: str, run_id: str) -> None:
        self.root = Path(metadata_path) / run_id

    def _file(self, batch: int, shard_id: str) -> Path:
        return self.root / f"{batch:012d}" / f"{shard_id}.json"

    def load(self, batch: int, shard_id: str) -> ShardBatchEnd | None:
        """The recorded end, or None if no attempt finished this shard of this batch yet."""
        path = self._file(batch, shard_id)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return ShardBatchEnd.from_json(text)
        except (ValueError, KeyError, TypeError) as error:
            raise SourceMetadataError(f"unreadable batch end {path}: {error}") from error

    def record_first(self, batch: int, shard_id: str, end: ShardBatchEnd) -> ShardBatchEnd:
        """Record ``end`` unless an end is recorded already; returns the one that holds."""
        path = self._file(batch, shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        with open(temporary, "w") as out:
            out.write(end.to_json())
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, path)  # atomic, and fails if another attempt got there first
        except FileExistsError:
            existing = self.load(batch, shard_id)
            assert existing is not None
            return existing
        finally:
            temporary.unlink(missing_ok=True)
        return end

    def require(self, batch: int, shard_id: str) -> ShardBatchEnd:
        """The recorded end of a batch that completed; raises if it is not there."""
        end = self.load(batch, shard_id)
        if end is None:
            raise SourceMetadataError(
                f"no recorded end for shard {shard_id} in batch {batch} under {self.root}: "
                "the metadataPath was changed, cleaned or is not shared with the executors"
            )
        return end

    def forget_before(self, batch: int) -> None:
        """Delete the ends of batches older than ``batch`` (they are never replayed again)."""
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            if child.name.isdigit() and int(child.name) < batch:
                shutil.rmtree(child, ignore_errors=True)
