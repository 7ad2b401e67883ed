"""The demo's Spark side: a local session and the two streaming queries over the orders stream.

- **revenue**: business events -> one-minute event-time windows with a watermark -> events and
  amount per window, type and segment -> Parquet (append mode: a window is written once, when
  the watermark passed it).
- **alerts**: orders of at least ``LARGE_ORDER_EUR`` -> JSON alerts -> the shardflow sink ->
  the alerts stream.

Both read the orders stream through the shardflow source, each with its own metadata path.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from demo.ledger import LARGE_ORDER_EUR

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

WINDOW = "1 minute"
WATERMARK_DELAY = "2 minutes"
"""Event-time lateness tolerated; the feed is in time order, so this covers read skew only."""
TRIGGER = "2 seconds"

EVENT_SCHEMA = (
    "type STRING, event_id STRING, order_id STRING, customer_id STRING, category STRING, "
    "method STRING, status STRING, amount DECIMAL(12,2), ts STRING"
)


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where the jobs read and write (the local stack's Kinesis)."""

    kinesis_url: str
    region: str
    orders_stream: str
    alerts_stream: str
    # Where the source keeps its batch ends (default: the working directory); with
    # ``--cluster`` an S3 prefix on moto, reached at ``metadata_endpoint``.
    metadata_root: str | None = None
    metadata_endpoint: str | None = None


def start_spark(work_dir: Path, cluster: dict[str, str] | None = None) -> SparkSession:
    """A local[2] session (or one on a cluster, given its settings), quiet, in UTC, its Python
    workers on this interpreter."""
    # SparkContext takes its workers' interpreter from PYSPARK_PYTHON (default: python3 on
    # PATH, which may lack shardflow and pyarrow).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import shardflow.spark

    # Everything Spark writes on the side (shuffle files, its JVM's temporary files) goes
    # under the demo's working directory, which is removed at the end.
    jvm_tmp = work_dir / "jvm-tmp"
    jvm_tmp.mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder.master("local[2]")
    for key, value in (cluster or {}).items():
        builder = builder.config(key, value)
    spark = (
        builder.appName("shardflow-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work_dir / "warehouse"))
        .config("spark.local.dir", str(work_dir / "spark-local"))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={jvm_tmp}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    shardflow.spark.register(spark)
    return spark


def business_events(spark: SparkSession, where: Endpoints, work_dir: Path, job: str) -> DataFrame:
    """The orders stream's events, parsed, with ``event_time`` (ticks included)."""
    from pyspark.sql import functions as f

    reader = (
        spark.readStream.format("shardflow")
        .option("streamName", where.orders_stream)
        .option("endpointUrl", where.kinesis_url)
        .option("region", where.region)
        .option("startingPosition", "TRIM_HORIZON")
        .option("metadataPath", f"{where.metadata_root or work_dir}/source-{job}")
    )
    if where.metadata_endpoint:
        reader = reader.option("metadataEndpointUrl", where.metadata_endpoint)
    raw = reader.load()
    return (
        raw.select(f.from_json(f.col("data").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .withColumn("event_time", f.col("ts").cast("timestamp"))
    )


def start_revenue_job(
    spark: SparkSession, where: Endpoints, work_dir: Path, output: Path
) -> StreamingQuery:
    """Events and amount per one-minute window, type and segment, into Parquet at ``output``."""
    from pyspark.sql import functions as f

    events = business_events(spark, where, work_dir, "revenue")
    # No filter on the type: Spark pushes a filter that does not name the event-time column
    # below the watermark, and the closing tick would then never move it. The tick is grouped
    # like any event, in a window the watermark never passes, so it is never written.
    counted = events.withWatermark("event_time", WATERMARK_DELAY)
    segment = f.when(f.col("type") == "order", f.col("category")).otherwise(
        f.concat_ws("/", f.col("method"), f.col("status"))
    )
    per_window = (
        counted.groupBy(f.window("event_time", WINDOW), f.col("type"), segment.alias("segment"))
        .agg(f.count("*").alias("events"), f.sum("amount").alias("amount"))
        .select(
            f.col("window.start").alias("window_start"),
            f.col("window.end").alias("window_end"),
            "type",
            "segment",
            "events",
            "amount",
        )
    )
    return (
        per_window.writeStream.queryName("revenue")
        .format("parquet")
        .outputMode("append")
        .option("path", str(output))
        .option("checkpointLocation", str(work_dir / "checkpoint-revenue"))
        .trigger(processingTime=TRIGGER)
        .start()
    )


def start_alerts_job(spark: SparkSession, where: Endpoints, work_dir: Path) -> StreamingQuery:
    """Large orders as JSON alerts to the alerts stream, through the shardflow sink."""
    from pyspark.sql import functions as f

    events = business_events(spark, where, work_dir, "alerts")
    large = events.where((f.col("type") == "order") & (f.col("amount") >= f.lit(LARGE_ORDER_EUR)))
    alerts = large.select(
        f.to_json(
            f.struct(
                f.lit("large_order").alias("alert"),
                "order_id",
                "customer_id",
                "category",
                "amount",
                "ts",
            )
        ).alias("data"),
        f.col("customer_id").alias("partitionKey"),
    )
    return (
        alerts.writeStream.queryName("alerts")
        .format("shardflow")
        .option("streamName", where.alerts_stream)
        .option("endpointUrl", where.kinesis_url)
        .option("region", where.region)
        .option("checkpointLocation", str(work_dir / "checkpoint-alerts"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
