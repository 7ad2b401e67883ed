"""Orders from Kinesis: a streaming table of the records, and a materialized view per minute.

``spark`` is the pipeline's (Spark Connect) session, given to every definitions file.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import shardflow.spark

shardflow.spark.register(spark)  # type: ignore[name-defined]  # noqa: F821

STREAM = os.environ.get("ORDERS_STREAM", "orders")
# Where the source records each micro-batch's end: keep it with the pipeline's storage
# (s3://bucket/prefix on a cluster).
METADATA = os.environ.get("ORDERS_METADATA", "/tmp/shardflow-orders-pipeline/shardflow-metadata")


@dp.table(comment="Every Kinesis record of the orders stream, once.")
def orders_raw() -> DataFrame:
    return (
        spark.readStream.format("shardflow")  # type: ignore[name-defined]  # noqa: F821
        .option("streamName", STREAM)
        .option("metadataPath", METADATA)
        .load()
        .select(
            "partitionKey",
            "sequenceNumber",
            "approximateArrivalTimestamp",
            F.col("data").cast("string").alias("json"),
        )
    )


@dp.materialized_view(comment="Orders and amounts per minute of arrival.")
def orders_per_minute() -> DataFrame:
    orders = spark.read.table("orders_raw").withColumn(  # type: ignore[name-defined]  # noqa: F821
        "amount", F.get_json_object("json", "$.amount").cast("double")
    )
    return orders.groupBy(
        F.date_trunc("minute", "approximateArrivalTimestamp").alias("minute")
    ).agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
