"""The Spark sink and source on a stream of another account: ``streamARN`` with ``roleArn``
(and ``roleSessionName``, ``externalId``), the region taken from the ARN (moto's STS and
Kinesis; the records checked with the other account's own keys)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from support.accounts import ROLE_ARN, other_account_stream, read_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.timeout(120)


def test_sink_and_source_reach_another_accounts_stream_with_the_role(
    spark: SparkSession, moto_url: str, stream_name: str
) -> None:
    other = other_account_stream(moto_url, stream_name, shards=2, region="eu-west-1")
    role = {"roleArn": ROLE_ARN, "roleSessionName": "spark-job", "externalId": "e-7"}
    rows = [(f"row-{i}".encode(), f"key-{i % 5}") for i in range(60)]
    df = spark.createDataFrame(rows, "data binary, partitionKey string").repartition(2)
    writer = df.write.format("shardflow").option("streamARN", other.arn)
    writer = writer.option("endpointUrl", moto_url).options(**role)
    writer.mode("append").save()
    assert sorted(read_all(other.kinesis, stream_name)) == sorted((k, d) for d, k in rows)

    # No region option: the ARN's (eu-west-1), where the stream is.
    reader = spark.read.format("shardflow").option("streamARN", other.arn)
    read = reader.option("endpointUrl", moto_url).options(**role).load().collect()
    assert sorted(bytes(row.data) for row in read) == sorted(d for d, _ in rows)
