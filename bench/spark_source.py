"""Throughput of the shardflow Spark source and sink, against plain boto3 loops, in one run.

Kinesis runs on kinesalite (its read speed holds as a stream fills). Every record carries a
unique id up front, and every contender's rows are checked id by id: a contender that lost a
record or handed one out twice posts no number.

Source. For each variant (plain records, and the same records KPL-aggregated by shardflow's
producer) one stream of ``--records`` x ``--size`` B records in ``--shards`` shards is
preloaded, then drained by:

1. a plain boto3 loop: one thread per shard, GetShardIterator TRIM_HORIZON, GetRecords
   (Limit 10,000) until the shard is caught up, taking each record's id; for the aggregated
   variant the records are deaggregated (shardflow.aggregation) so that it hands out the same
   rows — the floor;
2. the source in Structured Streaming: ``readStream.format("shardflow")`` with
   Trigger.AvailableNow, each row's id (parsed by Spark from ``data``) collected to the
   driver per micro-batch (``foreachBatch``, ``toArrow``), Spark local[2] (two tasks at a time: two of the four shards, where the loop reads
   all four). Timed from the start of its first trigger (as the query's progress reports it:
   latestOffset with its probes, planning, batch-end records, Arrow conversion and the
   offset and commit logs are in) to the query's end; the query's start before that (a
   Python process for the source on the driver, the shard listing), paid once per query, is
   reported apart, with the rate counting it;
3. the source as a batch read: ``spark.read.format("shardflow")`` with the ids collected to
   the driver (``toArrow``).

Sink. ``--sink-records`` records of the same shape are written into a new stream by a plain
boto3 PutRecords loop (500 a call, failed entries sent again: the loop people write) and by
``df.write.format("shardflow")`` of a DataFrame Spark makes (``spark.range``, one partition
per core, the producers' per-shard pacing off: kinesalite has no limits and the loop does
not pace); each stream is read back and its ids checked.

The SparkSession is started before (its 7-10 s cold start is not counted), and a first
batch read, streaming query and write (warming up the JVM, the Python workers and their
producers) are done before timing too.

Then the cost of an idle trigger: a running query (ProcessingTime 0) on the drained stream,
with every trigger reported (``noDataProgressEventInterval`` 0): the median time of a trigger
that found nothing (the source probes each shard; no batch is planned) and of its
``latestOffset`` call.

    .venv/bin/python bench/spark_source.py                      # 1M records, 2 rounds
    .venv/bin/python bench/spark_source.py --records 200000     # quicker
    .venv/bin/python bench/spark_source.py --scale --shards 256 --records 256000 --cluster
                                                    # many shards: bench/spark_scale.py
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


def payloads(count: int, size: int, first: int = 0) -> list[tuple[str, bytes]]:
    """``(partition key, data)``: ``size``-byte records with ids ``first``, ``first + 1``, ...
    up front."""
    return [
        (f"key-{i % 10_000}", (b"%010d|" % i).ljust(size, b"x"))
        for i in range(first, first + count)
    ]


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
                    for key, data in payloads(min(chunk, count - start), size, start)
                ]
                await producer.flush()
                for future in futures:
                    future.result()

    started = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - started


def boto3_loop(endpoint: str, stream: str, aggregated: bool) -> tuple[float, list[int]]:
    """Drain every shard with plain boto3, one thread per shard; (seconds, record ids)."""
    import boto3

    from shardflow.aggregation import deaggregate
    from shardflow.records import Record

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)
    shard_ids = [s["ShardId"] for s in client.list_shards(StreamName=stream)["Shards"]]
    found: dict[str, list[int]] = {}

    def drain(shard_id: str) -> None:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        ids: list[int] = []
        for _ in range(1_000_000):  # bounded: ends at the tip long before
            page = client.get_records(ShardIterator=iterator, Limit=10_000)
            records = page["Records"]
            if aggregated:
                for raw in records:
                    subs = deaggregate(
                        Record(
                            data=raw["Data"],
                            partition_key=raw["PartitionKey"],
                            sequence_number=raw["SequenceNumber"],
                        )
                    )
                    ids.extend(int(sub.data[:10]) for sub in subs)
            else:
                ids.extend(int(raw["Data"][:10]) for raw in records)
            iterator = page.get("NextShardIterator")
            if not records or iterator is None:
                break
        found[shard_id] = ids

    started = time.perf_counter()
    threads = [threading.Thread(target=drain, args=(s,)) for s in shard_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return seconds, [i for ids in found.values() for i in ids]


def check_ids(ids: Any, expected: int) -> dict[str, int]:
    """Rows, records lost and records read more than once, of ids that should be exactly
    0 .. expected-1 once each (``ids``: a list or an Arrow array of integers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = pa.chunked_array([pa.array(ids, pa.int64())]) if isinstance(ids, list) else ids
    rows = len(array)
    in_range = pc.filter(array, pc.and_(pc.greater_equal(array, 0), pc.less(array, expected)))
    distinct = pc.count_distinct(in_range).as_py() if len(in_range) else 0
    return {"rows": rows, "lost": expected - distinct, "duplicates": rows - distinct}


# The id each record carries up front (see payloads), as Spark reads it from the data column.
ID_COLUMN = "cast(cast(substring(data, 1, 10) AS string) AS bigint) AS id"


def source_options(endpoint: str, stream: str) -> dict[str, str]:
    return {"streamName": stream, "endpointUrl": endpoint, "region": REGION}


def spark_stream(
    spark: Any, endpoint: str, stream: str, work: Path, run: str
) -> tuple[float, Any, dict[str, float]]:
    """Drain with readStream + AvailableNow, each micro-batch's ids collected on the driver
    (``foreachBatch``, ``toArrow``; a fresh checkpoint named ``run``); (seconds, the ids, the
    query's start).

    Timed from the start of the first trigger (as the query's progress reports it) to the
    query's end: every trigger (latestOffset with its probes, planning, reading, collecting
    the ids, offset and commit logs) is in. The query's start before that (a Python process on
    the driver for the source, its imports, the shard listing) is once per query, like the
    SparkSession's start, and is reported apart.
    """
    reader = spark.readStream.format("shardflow").options(**source_options(endpoint, stream))
    df = reader.option("metadataPath", str(work / f"{run}-meta")).load().selectExpr(ID_COLUMN)
    batches: dict[int, Any] = {}

    def keep(batch: Any, batch_id: int) -> None:
        # A micro-batch run again replaces its ids: each batch counts once.
        batches[batch_id] = batch.toArrow().column("id")

    called = time.time()
    query = (
        df.writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(work / f"{run}-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    ended = time.time()
    first = min(
        datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        for p in query.recentProgress
    )
    start = {"query_start_seconds": first - called, "seconds_with_start": ended - called}
    import pyarrow as pa

    ids = pa.chunked_array(
        [chunk for _, column in sorted(batches.items()) for chunk in column.chunks], pa.int64()
    )
    return ended - first, ids, start


def spark_batch(spark: Any, endpoint: str, stream: str) -> tuple[float, Any]:
    """``spark.read`` every shard, the ids collected to the driver; (seconds, ids)."""
    started = time.perf_counter()
    reader = spark.read.format("shardflow").options(**source_options(endpoint, stream))
    ids = reader.load().selectExpr(ID_COLUMN).toArrow().column("id")
    return time.perf_counter() - started, ids


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


Contender = Callable[[int], tuple[Any, ...]]
"""A contender as a function of the round number: (seconds, the ids it handed out or wrote)
and, for some, a dict of more timings."""


def contenders_for(
    spark: Any, endpoint: str, stream: str, aggregated: bool, work: Path
) -> dict[str, Contender]:
    return {
        "boto3 GetRecords loop": lambda _: boto3_loop(endpoint, stream, aggregated),
        "source, readStream AvailableNow": lambda r: spark_stream(
            spark, endpoint, stream, work, f"{stream}-{r}"
        ),
        "source, read (batch)": lambda _: spark_batch(spark, endpoint, stream),
    }


# --- the sink --------------------------------------------------------------------------------


def create_stream(endpoint: str, stream: str, shards: int) -> None:
    import boto3

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)
    client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


def boto3_put_loop(endpoint: str, stream: str, count: int, size: int) -> float:
    """The loop people write by hand (bench/producer.py's floor: PutRecords of 500, failed
    entries sent again); seconds."""
    from producer import run_boto3  # bench/ is this script's first import path

    items = payloads(count, size)
    started = time.perf_counter()
    run_boto3(endpoint, stream, items)
    return time.perf_counter() - started


def spark_sink(spark: Any, endpoint: str, stream: str, count: int, size: int) -> float:
    """``df.write.format("shardflow")`` of the same records (made by Spark, ``spark.range``,
    one partition per core); seconds. The producers' per-shard pacing is off, as kinesalite
    has no limits and the boto3 loop does not pace."""
    df = spark.range(count).selectExpr(
        f"concat(lpad(cast(id AS string), 10, '0'), '|', repeat('x', {size - 11})) AS data",
        "concat('key-', cast(id % 10000 AS string)) AS partitionKey",
    )
    started = time.perf_counter()
    (
        df.write.format("shardflow")
        .options(**source_options(endpoint, stream))
        .option("shardRecordsPerSecond", str(UNLIMITED))
        .option("shardBytesPerSecond", str(UNLIMITED))
        .mode("append")
        .save()
    )
    return time.perf_counter() - started


def sink_contenders(spark: Any, endpoint: str, args: argparse.Namespace) -> dict[str, Contender]:
    """Each writes ``--records`` records into a new stream, then the stream is read back."""

    def run(tag: str, write: Callable[[str], float]) -> Contender:
        def contender(round_: int) -> tuple[float, Any]:
            stream = f"bench-sink-{tag}-{round_}"
            create_stream(endpoint, stream, args.shards)
            seconds = write(stream)
            return seconds, boto3_loop(endpoint, stream, aggregated=False)[1]

        return contender

    return {
        "boto3 PutRecords loop": run(
            "boto3", lambda s: boto3_put_loop(endpoint, s, args.sink_records, args.size)
        ),
        "sink, write (batch)": run(
            "spark", lambda s: spark_sink(spark, endpoint, s, args.sink_records, args.size)
        ),
    }


def measure(
    variant: str, contenders: dict[str, Contender], rounds: int, expected: int
) -> list[dict[str, Any]]:
    """Run every contender ``rounds`` times (order rotated) and check every id each time."""
    timings: dict[str, list[tuple[float, dict[str, int]]]] = {name: [] for name in contenders}
    extra: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(rounds):
        # Rotate the order: whoever goes first meets the coldest emulator.
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            seconds, ids, *more = contenders[name](round_)
            timings[name].append((seconds, check_ids(ids, expected)))
            if more:
                extra[name].append(more[0])
            print(variant, name, round(seconds, 2), timings[name][-1][1], *more, flush=True)
    rows: list[dict[str, Any]] = []
    baseline_rate = None
    for contender, got in timings.items():
        seconds = statistics.median(t for t, _ in got)
        lost = max(c["lost"] for _, c in got)
        duplicates = max(c["duplicates"] for _, c in got)
        more_timings = {
            key: round(statistics.median(e[key] for e in extra[contender]), 2)
            for key in (extra[contender][0] if extra[contender] else {})
        }
        # Every round handed out (or wrote) every id exactly once, or no number is posted.
        verified = lost == 0 and duplicates == 0
        rate = expected / seconds if verified else None
        if contender.startswith("boto3"):
            baseline_rate = rate
        rows.append(
            {
                "variant": variant,
                "contender": contender,
                "seconds": round(seconds, 2),
                "rows": min(c["rows"] for _, c in got),
                "lost": lost,
                "duplicates": duplicates,
                "verified": verified,
                "rows_per_second": None if rate is None else round(rate),
                "ratio_to_boto3": (
                    None if rate is None or not baseline_rate else round(rate / baseline_rate, 2)
                ),
                **more_timings,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


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
    parser.add_argument("--sink-records", type=int, default=300_000)
    parser.add_argument("--no-sink", action="store_true", help="leave out the sink rows")
    scale = parser.add_argument_group("--scale: many shards (bench/spark_scale.py)")
    scale.add_argument("--scale", action="store_true", help="the many-shard run instead")
    scale.add_argument("--shards-per-task", default="auto,1,4,8")
    scale.add_argument("--cluster", action="store_true", help="also on a standalone cluster")
    scale.add_argument("--cluster-shards-per-task", default="auto,1")
    scale.add_argument("--max-sweep-seconds", type=float, default=10.0)
    args = parser.parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        os.environ.setdefault(name, value)

    if args.scale:
        from spark_scale import main_scale  # bench/ is this script's first import path

        main_scale(args)
        return

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
        spark_stream(spark, endpoint, "bench-warm", work, "bench-warm")
        spark_sink(spark, endpoint, "bench-warm", 1000, args.size)  # producers started
        for aggregated in (False, True):
            stream = "bench-spark-aggregated" if aggregated else "bench-spark-plain"
            load_s = preload(endpoint, stream, args.shards, args.records, args.size, aggregated)
            print(f"preloaded {args.records:,} records into {stream} in {load_s:.1f}s", flush=True)
            contenders = contenders_for(spark, endpoint, stream, aggregated, work)
            variant = "aggregated" if aggregated else "plain"
            results += measure(variant, contenders, args.repeat, args.records)
            if not aggregated:
                idle = idle_triggers(
                    spark, endpoint, stream, work, f"{stream}-0", args.idle_seconds
                )
                print(json.dumps(idle), flush=True)
        if not args.no_sink:
            results += measure(
                "sink", sink_contenders(spark, endpoint, args), args.repeat, args.sink_records
            )
        spark.stop()

    payload = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "sink_records": None if args.no_sink else args.sink_records,
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
    if "runs" in result:  # a --scale run (bench/results/spark_source-scale.json)
        from spark_scale import render_scale

        return render_scale(result)
    lines = [
        f"{result['records']:,} x {result['record_bytes']} B records, {result['shards']} shards, "
        f"kinesalite, Spark local[2], median of {result['rounds']} round(s), order rotated "
        "each round",
        "",
        "| variant | contender | rows/s | vs boto3 loop | seconds | record ids |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in result["results"]:
        rate = "failed" if r["rows_per_second"] is None else f"{r['rows_per_second']:,}"
        ratio = "" if r["ratio_to_boto3"] is None else f"{r['ratio_to_boto3']:.2f}x"
        if "verified" not in r:
            ids = "count only"
        elif r["verified"]:
            ids = "each once"
        else:
            ids = f"{r['lost']:,} lost, {r['duplicates']:,} duplicated"
        lines.append(
            f"| {r['variant']} | {r['contender']} | {rate} | {ratio} | {r['seconds']:.2f} | {ids} |"
        )
    for r in result["results"]:
        if r.get("query_start_seconds") is None or not r["rows_per_second"]:
            continue
        baseline = next(
            b
            for b in result["results"]
            if b["variant"] == r["variant"] and b["contender"].startswith("boto3")
        )
        with_start = result["records"] / r["seconds_with_start"]
        ratio = with_start / baseline["rows_per_second"] if baseline["rows_per_second"] else 0
        lines.append(
            f"\n{r['variant']}, {r['contender']}: timed from its first trigger; the query's "
            f"start before it (once per query: the source's Python process on the driver, "
            f"shard listing) took {r['query_start_seconds']:.2f} s; counting it, "
            f"{with_start:,.0f} rows/s ({ratio:.2f}x)"
        )
    if result.get("sink_records"):
        lines.append(
            f"\nsink rows: {result['sink_records']:,} records written into a new stream each "
            "time, then read back and checked"
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


def render_summary(result: dict[str, Any]) -> str:
    """One paragraph for the Spark guide: the readStream and sink figures of the run."""

    def row(variant: str, contender: str) -> dict[str, Any]:
        return next(
            r for r in result["results"] if r["variant"] == variant and r["contender"] == contender
        )

    def ratio(r: dict[str, Any]) -> str:
        return "failed" if r["ratio_to_boto3"] is None else f"{r['ratio_to_boto3']:.2f}x"

    stream = "source, readStream AvailableNow"
    plain, aggregated = row("plain", stream), row("aggregated", stream)
    text = (
        f"{result['records']:,} x {result['record_bytes']} B records from "
        f"{result['shards']} shards on kinesalite, Spark local[2], every record id checked: "
        f"Structured Streaming reads {plain['rows_per_second'] or 0:,} rows/s "
        f"({ratio(plain)} a plain boto3 GetRecords loop in the same run) and "
        f"{aggregated['rows_per_second'] or 0:,} rows/s from KPL aggregates "
        f"({ratio(aggregated)}), timed from the first trigger (a query's start, once, took "
        f"{plain['query_start_seconds']:.1f} s); batch reads "
        f"{ratio(row('plain', 'source, read (batch)'))} and "
        f"{ratio(row('aggregated', 'source, read (batch)'))}."
    )
    if result.get("sink_records"):
        sink = row("sink", "sink, write (batch)")
        text += (
            f" The sink writes {sink['rows_per_second'] or 0:,} rows/s ({ratio(sink)} a plain "
            "boto3 PutRecords loop)."
        )
    idle = result["idle_trigger"]
    if idle.get("median_trigger_ms") is not None:
        text += (
            f" An idle trigger costs a median {idle['median_trigger_ms']:g} ms and plans no batch."
        )
    return text


if __name__ == "__main__":
    main()
