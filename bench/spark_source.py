"""Read throughput of the shardflow Spark source, against a plain boto3 GetRecords loop, in one run.

Kinesis runs on kinesalite (its read speed holds as a stream fills). For each variant (plain
records, and the same records KPL-aggregated by shardflow's producer) one stream of
``--records`` x ``--size`` B records in ``--shards`` shards is preloaded, then drained by:

1. a plain boto3 loop: one thread per shard, GetShardIterator TRIM_HORIZON, GetRecords
   (Limit 10,000) until the shard is caught up; for the aggregated variant the records are
   deaggregated (shardflow.aggregation) so that it hands out the same rows — the floor;
2. the source in Structured Streaming: ``readStream.format("shardflow")`` with
   Trigger.AvailableNow into the ``noop`` sink (micro-batch planning, metadata writes and
   Arrow conversion included), Spark local[2];
3. the source as a batch read: ``spark.read.format("shardflow")...count()``.

Each is timed from its start to its last row; the SparkSession is started before (its 7-10 s
cold start is not counted) and the first Spark job of the run (warming up JVM and Python
workers) is done before timing too. Row counts are checked: a contender that does not hand
out exactly the rows written posts no number.

Then the cost of an idle trigger: a running query (ProcessingTime 0) on the drained stream,
with every trigger reported (``noDataProgressEventInterval`` 0): the median time of a trigger
that found nothing (the source probes each shard; no batch is planned) and of its
``latestOffset`` call.

    .venv/bin/python bench/spark_source.py                      # 1M records, 2 rounds (~15 min)
    .venv/bin/python bench/spark_source.py --records 200000     # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# make bench (the short mode) writes elsewhere: only full runs are the docs' figures.
RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
REGION = "us-east-1"
UNLIMITED = 1e12


def payloads(count: int, size: int) -> list[tuple[str, bytes]]:
    """``(partition key, data)``: ``size``-byte records with a unique id up front."""
    return [(f"key-{i % 10_000}", (b"%010d|" % i).ljust(size, b"x")) for i in range(count)]


def preload(
    endpoint: str, stream: str, shards: int, count: int, size: int, aggregate: bool
) -> float:
    """Create the stream and write the records with shardflow's producer; returns seconds."""
    from shardflow.aws import AwsSettings, ClientFactory
    from shardflow.aws.kinesis import wait_for_active
    from shardflow.producer import Producer, ProducerSettings

    aws = AwsSettings(endpoint_url=endpoint, region=REGION)

    async def main() -> None:
        async with ClientFactory(aws).kinesis() as kinesis:
            await kinesis.create_stream(StreamName=stream, ShardCount=shards)
            await wait_for_active(kinesis, stream)
        settings = ProducerSettings(
            aggregate=aggregate,
            shard_records_per_second=UNLIMITED,
            shard_bytes_per_second=UNLIMITED,
        )
        async with Producer(stream, settings=settings, aws=aws) as producer:
            chunk = 50_000
            for start in range(0, count, chunk):
                futures = [
                    await producer.put(data, key)
                    for key, data in payloads(min(chunk, count - start), size)
                ]
                await producer.flush()
                for future in futures:
                    future.result()

    started = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - started


def boto3_loop(endpoint: str, stream: str, aggregated: bool) -> tuple[float, int]:
    """Drain every shard with plain boto3, one thread per shard; (seconds, rows)."""
    import boto3

    from shardflow.aggregation import deaggregate
    from shardflow.records import Record

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)
    shard_ids = [s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"]]
    counts: dict[str, int] = {}

    def drain(shard_id: str) -> None:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        rows = 0
        for _ in range(1_000_000):  # bounded: ends at the tip long before
            page = client.get_records(ShardIterator=iterator, Limit=10_000)
            records = page["Records"]
            if aggregated:
                for raw in records:
                    rows += len(
                        deaggregate(
                            Record(
                                data=raw["Data"],
                                partition_key=raw["PartitionKey"],
                                sequence_number=raw["SequenceNumber"],
                            )
                        )
                    )
            else:
                rows += len(records)
            iterator = page.get("NextShardIterator")
            if not records or iterator is None:
                break
        counts[shard_id] = rows

    started = time.perf_counter()
    threads = [threading.Thread(target=drain, args=(s,)) for s in shard_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, sum(counts.values())


def source_options(endpoint: str, stream: str) -> dict[str, str]:
    return {"streamName": stream, "endpointUrl": endpoint, "region": REGION}


def spark_stream(spark: Any, endpoint: str, stream: str, work: Path, run: str) -> tuple[float, int]:
    """Drain with readStream + AvailableNow into the noop sink (a fresh checkpoint named
    ``run``); (seconds, rows)."""
    reader = spark.readStream.format("shardflow").options(**source_options(endpoint, stream))
    df = reader.option("metadataPath", str(work / f"{run}-meta")).load()
    started = time.perf_counter()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(work / f"{run}-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    return seconds, sum(p["numInputRows"] for p in query.recentProgress)


def spark_batch(spark: Any, endpoint: str, stream: str) -> tuple[float, int]:
    started = time.perf_counter()
    rows = spark.read.format("shardflow").options(**source_options(endpoint, stream)).load().count()
    return time.perf_counter() - started, rows


def idle_triggers(
    spark: Any, endpoint: str, stream: str, work: Path, run: str, seconds: float
) -> dict[str, Any]:
    """Run a query on the drained stream (continuing the AvailableNow checkpoint) and time the
    triggers that found nothing."""
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    reader = spark.readStream.format("shardflow").options(**source_options(endpoint, stream))
    df = reader.option("metadataPath", str(work / f"{run}-meta")).load()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(work / f"{run}-ckpt"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    time.sleep(seconds)
    query.stop()
    idle = [
        p
        for p in query.recentProgress
        if p["numInputRows"] == 0 and "latestOffset" in p["durationMs"]
    ]
    batches = [
        p for p in query.recentProgress if p.get("batchId") is not None and p["numInputRows"]
    ]
    trigger_ms = [p["durationMs"]["triggerExecution"] for p in idle]
    latest_ms = [p["durationMs"]["latestOffset"] for p in idle]
    return {
        "idle_triggers": len(idle),
        "batches_with_rows": len(batches),
        "median_trigger_ms": statistics.median(trigger_ms) if trigger_ms else None,
        "median_latest_offset_ms": statistics.median(latest_ms) if latest_ms else None,
    }


def contenders_for(
    spark: Any, endpoint: str, stream: str, aggregated: bool, work: Path
) -> dict[str, Callable[[int], tuple[float, int]]]:
    """Each contender as a function of the round number, returning (seconds, rows)."""
    return {
        "boto3 GetRecords loop": lambda _: boto3_loop(endpoint, stream, aggregated),
        "source, readStream AvailableNow": lambda r: spark_stream(
            spark, endpoint, stream, work, f"{stream}-{r}"
        ),
        "source, read (batch)": lambda _: spark_batch(spark, endpoint, stream),
    }


def start_spark() -> Any:
    from pyspark.sql import SparkSession

    import shardflow.spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("shardflow-bench-spark-source")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    shardflow.spark.register(spark)
    return spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the median is shown")
    args = parser.parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        os.environ.setdefault(name, value)

    from shardflow.local import KinesaliteServer

    results: list[dict[str, Any]] = []
    idle: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="shardflow-bench-spark-") as tmp,
        KinesaliteServer(log_dir=Path(tmp)) as server,
    ):
        work = Path(tmp)
        endpoint = server.endpoint_url
        spark = start_spark()
        # Warm up: JVM, Python workers, imports in workers.
        warm = "bench-warm"
        preload(endpoint, warm, 2, 1000, args.size, aggregate=False)
        spark_batch(spark, endpoint, warm)
        for aggregated in (False, True):
            stream = "bench-spark-aggregated" if aggregated else "bench-spark-plain"
            load_s = preload(endpoint, stream, args.shards, args.records, args.size, aggregated)
            print(f"preloaded {args.records:,} records into {stream} in {load_s:.1f}s", flush=True)
            contenders = contenders_for(spark, endpoint, stream, aggregated, work)
            timings: dict[str, list[tuple[float, int]]] = {name: [] for name in contenders}
            names = list(contenders)
            for round_ in range(args.repeat):
                # Rotate the order: whoever reads first meets the coldest emulator.
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    timings[name].append(contenders[name](round_))
                    print(name, timings[name][-1], flush=True)
            baseline_rate = None
            for contender, got in timings.items():
                seconds = statistics.median(t for t, _ in got)
                rows = min(n for _, n in got)
                ok = all(n == args.records for _, n in got)  # every round handed out every row
                rate = args.records / seconds if ok else None
                if contender.startswith("boto3"):
                    baseline_rate = rate
                results.append(
                    {
                        "variant": "aggregated" if aggregated else "plain",
                        "contender": contender,
                        "seconds": round(seconds, 2),
                        "rows": rows,
                        "rows_per_second": None if rate is None else round(rate),
                        "ratio_to_boto3": (
                            None
                            if rate is None or not baseline_rate
                            else round(rate / baseline_rate, 2)
                        ),
                    }
                )
                print(json.dumps(results[-1]), flush=True)
            if not aggregated:
                idle = idle_triggers(
                    spark, endpoint, stream, work, f"{stream}-0", args.idle_seconds
                )
                print(json.dumps(idle), flush=True)
        spark.stop()

    payload = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "record_bytes": args.size,
        "shards": args.shards,
        "rounds": args.repeat,
        "results": results,
        "idle_trigger": idle,
    }
    print("\n" + render(payload))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "spark_source.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


def render(result: dict[str, Any]) -> str:
    """The table of one run, from its JSON (bench/tables.py puts it into the docs)."""
    lines = [
        f"{result['records']:,} x {result['record_bytes']} B records, {result['shards']} shards, "
        f"kinesalite, Spark local[2], median of {result['rounds']} round(s), order rotated "
        "each round",
        "",
        "| variant | contender | rows/s | vs boto3 loop | seconds |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["results"]:
        rate = "failed" if r["rows_per_second"] is None else f"{r['rows_per_second']:,}"
        ratio = "" if r["ratio_to_boto3"] is None else f"{r['ratio_to_boto3']:.2f}x"
        lines.append(
            f"| {r['variant']} | {r['contender']} | {rate} | {ratio} | {r['seconds']:.2f} |"
        )
    idle = result["idle_trigger"]
    if idle.get("median_trigger_ms") is not None:
        lines.append(
            f"\nidle trigger ({result['shards']} shards, no data, no batch planned): median "
            f"{idle['median_trigger_ms']} ms per trigger, of which latestOffset "
            f"{idle['median_latest_offset_ms']} ms ({idle['idle_triggers']} triggers)"
        )
    machine = result["machine"]
    lines.append(f"\n({machine['cpus']} cores, Python {machine['python']})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
