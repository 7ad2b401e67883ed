"""metadataPath parsing, and the ids that become parts of metadata paths and keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardflow.aws.settings import AwsSettings
from shardflow.errors import MetadataOutOfStepError, SourceMetadataError, SparkOptionError
from shardflow.spark.source.metadata import ShardBatchEnd
from shardflow.spark.source.metadata_location import (
    MetadataLocation,
    StoreKind,
    checked_run_id,
    checked_shard_id,
    parse_location,
)
from shardflow.spark.source.options import parse_options
from shardflow.spark.source.stores import open_store

AWS = AwsSettings(region="eu-west-1", endpoint_url="http://127.0.0.1:5000")
RUN = "0123456789abcdef" * 2


@pytest.mark.parametrize(
    ("text", "kind", "where", "prefix"),
    [
        ("s3://meta-bucket/queries/orders/", StoreKind.S3, "meta-bucket", "queries/orders"),
        ("s3a://meta-bucket", StoreKind.S3, "meta-bucket", ""),
        ("dynamodb://orders-source-metadata", StoreKind.DYNAMODB, "orders-source-metadata", ""),
        ("file:///mnt/shared/meta", StoreKind.LOCAL, "/mnt/shared/meta", ""),
        ("/mnt/shared/meta", StoreKind.LOCAL, "/mnt/shared/meta", ""),
    ],
)
def test_locations(text: str, kind: StoreKind, where: str, prefix: str) -> None:
    location = parse_location(text, AWS)
    assert (location.kind, location.where, location.prefix) == (kind, where, prefix)
    if kind is not StoreKind.LOCAL:
        assert location.aws == AWS


@pytest.mark.parametrize(
    "text",
    [
        "s3://Bad_Bucket/x",
        "s3://meta-bucket/a//b",
        "s3://meta-bucket/a/../b",
        "dynamodb://x",
        "hdfs://namenode/meta",
        "file://",
    ],
)
def test_bad_locations_name_the_option(text: str) -> None:
    with pytest.raises(SparkOptionError) as caught:
        parse_location(text, AWS)
    assert caught.value.option == "metadataPath"


def test_the_store_endpoint_defaults_to_the_streams_and_can_be_set_apart() -> None:
    base = {"streamName": "orders", "endpointUrl": "http://127.0.0.1:1", "region": "us-east-1"}
    same = parse_options({**base, "metadataPath": "s3://meta-bucket/q"}, streaming=True)
    assert same.metadata is not None
    assert same.metadata.aws == AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:1")
    apart = parse_options(
        {
            **base,
            "metadataPath": "dynamodb://meta-table",
            "metadataEndpointUrl": "http://127.0.0.1:2",
            "metadataRegion": "eu-west-1",
        },
        streaming=True,
    )
    assert apart.metadata is not None
    assert apart.metadata.aws == AwsSettings(region="eu-west-1", endpoint_url="http://127.0.0.1:2")


@pytest.mark.parametrize(
    "run_id", ["../../etc", "run", "0123456789ABCDEF" * 2, RUN + "/x", "", RUN[:-1] + "\n"]
)
def test_run_ids_from_a_checkpoint_are_checked_before_use(run_id: str, tmp_path: Path) -> None:
    with pytest.raises(SourceMetadataError, match="new checkpointLocation"):
        checked_run_id(run_id)
    with pytest.raises(SourceMetadataError):
        open_store(MetadataLocation(StoreKind.LOCAL, str(tmp_path)), run_id)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shard_id", ["../x", "shardId-1/../../y", ".hidden", "a b", ""])
def test_shard_ids_are_checked_before_use(shard_id: str, tmp_path: Path) -> None:
    store = open_store(MetadataLocation(StoreKind.LOCAL, str(tmp_path)), RUN)
    with pytest.raises(SourceMetadataError, match="cannot name a batch end"):
        store.load(0, shard_id)
    assert checked_shard_id("shardId-000000000007") == "shardId-000000000007"


def test_an_end_recorded_by_a_batch_that_started_elsewhere_is_refused(tmp_path: Path) -> None:
    store = open_store(MetadataLocation(StoreKind.LOCAL, str(tmp_path)), RUN)
    recorded = ShardBatchEnd(end="AFTER:9", rows=3, stopped="tip", start="AFTER:6")
    store.check_start(2, "shardId-0", "AFTER:6", recorded)
    store.check_start(2, "shardId-0", "AFTER:1", ShardBatchEnd("AFTER:9", 3, "tip"))  # old end
    with pytest.raises(MetadataOutOfStepError, match=r"started at AFTER:6.*Fix: restart"):
        store.check_start(2, "shardId-0", "AFTER:1", recorded)
