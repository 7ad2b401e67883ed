"""One racer of the Spark source's batch-end store test: in a process of its own, record an end
of its own for batch 4 of ``shardId-0`` and report the end that holds.

A module of its own (not the test's) so that a ``spawn``-ed process can import it by name.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier

from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_location import MetadataLocation, StoreKind
from shardflow.spark.source.store_local import LocalBatchEnds

RUN = "0123456789abcdef" * 2


def local_store(root: str) -> LocalBatchEnds:
    return LocalBatchEnds(MetadataLocation(StoreKind.LOCAL, root), RUN)


def race(root: str, index: int, start: Barrier, results: multiprocessing.Queue[str]) -> None:
    store = local_store(root)
    mine = ShardBatchEnd(end=f"AFTER:{index + 1}", rows=index, stopped="tip")
    start.wait(60)  # every racer started and imported: they write at once
    results.put(store.record_first(4, "shardId-0", mine).end)
