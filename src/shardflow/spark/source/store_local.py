"""Batch ends as files in a directory the driver and every executor share (local or NFS).

``<dir>/<run id>/<batch>/<shard id>.json``; a complete temporary file is hard-linked into
place, which fails if the name exists: the first attempt wins atomically.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from shardflow.errors import SourceMetadataError
from shardflow.spark.source.metadata_location import MetadataLocation
from shardflow.spark.source.metadata_store import BatchEndStore, batch_name


class LocalBatchEnds(BatchEndStore):
    def __init__(self, location: MetadataLocation, run_id: str) -> None:
        super().__init__(location, run_id)
        self.root = Path(location.where) / self.run_id

    def prepare(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SourceMetadataError(
                f"cannot create the metadata directory {self.root}: {error}"
            ) from error

    def _file(self, batch: int, shard_id: str) -> Path:
        return self.root / batch_name(batch) / f"{shard_id}.json"

    def _read(self, batch: int, shard_id: str) -> str | None:
        try:
            return self._file(batch, shard_id).read_text()
        except FileNotFoundError:
            return None

    def _create(self, batch: int, shard_id: str, text: str) -> bool:
        path = self._file(batch, shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        with open(temporary, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, path)  # atomic, and fails if another attempt got there first
        except FileExistsError:
            return False
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def _delete_before(self, batch: int) -> None:
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            if child.name.isdigit() and int(child.name) < batch:
                shutil.rmtree(child, ignore_errors=True)
