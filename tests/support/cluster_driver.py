"""A Spark driver run as its own process against a standalone cluster (so a test can SIGKILL
it mid-query and start it again): the shardflow source into Parquet under Trigger.AvailableNow,
then, if asked, the Parquet output written to another stream by the shardflow sink.

    python cluster_driver.py CONFIG_JSON
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    config = json.loads(sys.argv[1])
    # Python workers (on the driver for planning, on executors for tasks) run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import shardflow.spark

    builder = SparkSession.builder.appName("shardflow-cluster-test")
    for key, value in config["spark"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    shardflow.spark.register(spark)
    aws = {"endpointUrl": config["endpoint"], "region": "us-east-1"}
    df = (
        spark.readStream.format("shardflow")
        .options(**aws)
        .option("streamName", config["stream"])
        .option("metadataPath", config["metadata"])
        .option("maxRecordsPerTrigger", str(config["perTrigger"]))
        .load()
    )
    query = (
        df.writeStream.format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", config["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if config.get("sinkStream"):
        (
            spark.read.parquet(config["out"])
            .selectExpr("data", "partitionKey")
            .write.format("shardflow")
            .options(**aws)
            .option("streamName", config["sinkStream"])
            .mode("append")
            .save()
        )
    print("DRIVER DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
