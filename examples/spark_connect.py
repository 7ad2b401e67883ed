"""Spark Connect way in: a streaming query from a remote client, run by the server.

On the local stack of Getting started (its stream ``orders``), with a Spark Connect server
started as in the Spark guide (docs/guides/spark.md#spark-connect, port 15002), this file saved
as ``spark_connect.py`` (``examples/spark_connect.py`` in the repository):

    eval "$(shardflow local up --quiet)"
    shardflow stream create large-order-alerts --shards 1
    printf '{"customer": "c1", "amount": 410}\n' | shardflow produce orders --key-field customer
    python spark_connect.py sc://127.0.0.1:15002 orders large-order-alerts

It copies what arrived on the first stream into the second through the ``shardflow`` source
and sink (``Trigger.AvailableNow``: everything up to now, then it stops) and prints how many
records it wrote. Run again, it copies only what arrived since: the checkpoint and the source's
batch ends live under ``--state`` (paths on the *server*; ``s3://...`` behind a cluster).
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("remote", help="the server's address, sc://HOST:PORT")
    parser.add_argument("source_stream")
    parser.add_argument("target_stream")
    parser.add_argument("--state", default="spark-connect-state", help="checkpoint directory")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--endpoint-url",
        help="Kinesis endpoint for the server's tasks (default: the server's environment)",
    )
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    import shardflow.spark

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    try:
        shardflow.spark.register(spark)
        endpoint = {"endpointUrl": args.endpoint_url} if args.endpoint_url else {}
        query = (
            spark.readStream.format("shardflow")
            .option("streamName", args.source_stream)
            .option("metadataPath", f"{args.state}/source-metadata")
            .options(**endpoint)
            .load()
            .selectExpr("data", "partitionKey")
            .writeStream.format("shardflow")
            .option("streamName", args.target_stream)
            .options(**endpoint)
            .option("checkpointLocation", f"{args.state}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(args.timeout):
            query.stop()
            raise SystemExit(f"the query did not finish within {args.timeout:g} s")
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        copied = sum(progress.numInputRows or 0 for progress in query.recentProgress)
        print(f"copied {copied} records from {args.source_stream} to {args.target_stream}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
