"""The source with ``metadataPath=s3://...`` on moto's S3, and what happens when the
checkpoint and the metadata get out of step: the query fails with an error naming the fix,
never reads records other than those its checkpoint stands for."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.boto import boto_client
from support.spark_source import (
    expect_each_once,
    make_stream,
    output_rows,
    payloads,
    source,
    to_parquet,
    write,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.timeout(180)


def bucket(moto_url: str) -> str:
    name = f"sf-meta-{uuid.uuid4().hex[:12]}"
    boto_client("s3", moto_url).create_bucket(Bucket=name)
    return name


def keys(moto_url: str, name: str) -> list[str]:
    listed = boto_client("s3", moto_url).list_objects_v2(Bucket=name)
    return [item["Key"] for item in listed.get("Contents", [])]


def run_once(spark: SparkSession, moto_url: str, stream: str, meta: str, tmp: Path) -> str | None:
    df = source(spark, moto_url, stream, metadataPath=meta, maxRecordsPerTrigger="150")
    query = to_parquet(df, tmp / "out", tmp / "ckpt")
    try:
        query.awaitTermination(120)
    except Exception as error:  # StreamingQueryException: the source's error is in its text
        return str(error)
    error = query.exception()
    return None if error is None else str(error)


def test_batches_end_on_s3_and_a_restart_goes_on_from_there(
    spark: SparkSession, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    make_stream(moto_url, stream_name, 2)
    first, second = payloads("s3a", 300), payloads("s3b", 200)
    write(moto_url, stream_name, first)
    name = bucket(moto_url)
    meta = f"s3://{name}/queries/{stream_name}"
    assert run_once(spark, moto_url, stream_name, meta, tmp_path) is None
    recorded = keys(moto_url, name)
    assert recorded, "no batch end on S3"
    assert all(k.startswith(f"queries/{stream_name}/") and k.endswith(".json") for k in recorded)
    write(moto_url, stream_name, second)
    assert run_once(spark, moto_url, stream_name, meta, tmp_path) is None
    expect_each_once(output_rows(spark, tmp_path / "out"), first + second)


def test_metadata_out_of_step_with_the_checkpoint_fails_with_the_fix(
    spark: SparkSession, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    make_stream(moto_url, stream_name, 1)
    write(moto_url, stream_name, payloads("r", 400))
    name = bucket(moto_url)
    meta = f"s3://{name}/q"
    assert run_once(spark, moto_url, stream_name, meta, tmp_path) is None
    logged = (tmp_path / "ckpt" / "commits").iterdir()
    commits = sorted((p for p in logged if p.name.isdigit()), key=lambda p: int(p.name))
    assert len(commits) >= 2

    # A batch logged but not committed is replayed from the checkpoint alone after a restart:
    # against a metadataPath without the previous batch's ends it must not read afresh.
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    error = run_once(spark, moto_url, stream_name, f"s3://{bucket(moto_url)}/q", tmp_path)
    assert error is not None
    assert "MetadataOutOfStepError" in error
    assert "Fix: restart the query with the metadataPath it was started with" in error

    # The metadataPath cleaned behind the query's back: the next batch cannot be planned.
    s3 = boto_client("s3", moto_url)
    for key in keys(moto_url, name):
        s3.delete_object(Bucket=name, Key=key)
    write(moto_url, stream_name, payloads("d", 50))
    error = run_once(spark, moto_url, stream_name, meta, tmp_path)
    assert error is not None
    assert "MetadataOutOfStepError" in error
    assert "holds no end for it" in error
    assert "new checkpointLocation" in error
