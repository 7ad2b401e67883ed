"""Opening the batch-end store a ``metadataPath`` names: a directory, S3 or DynamoDB."""

from __future__ import annotations

from shardflow.spark.source.metadata_location import MetadataLocation, StoreKind
from shardflow.spark.source.metadata_store import BatchEndStore
from shardflow.spark.source.store_dynamodb import DynamoDBBatchEnds
from shardflow.spark.source.store_local import LocalBatchEnds
from shardflow.spark.source.store_s3 import S3BatchEnds


def open_store(location: MetadataLocation, run_id: str) -> BatchEndStore:
    """The store of ``run_id`` at ``location``."""
    if location.kind is StoreKind.S3:
        return S3BatchEnds(location, run_id)
    if location.kind is StoreKind.DYNAMODB:
        return DynamoDBBatchEnds(location, run_id)
    return LocalBatchEnds(location, run_id)
