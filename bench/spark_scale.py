"""``bench/spark_source.py --scale``: the Spark source on a stream of many shards (256).

Per variant (plain records, KPL-aggregated), one stream of ``--records`` records in
``--shards`` shards on kinesalite is drained, every round, by the plain boto3 loop (one thread
per shard) and by ``readStream`` + Trigger.AvailableNow at each ``shardsPerTask`` of
``--shards-per-task`` (``auto``: the source's default), every id checked; the median of
``--repeat`` rounds, order rotated. Per run it keeps, from the query's progress, the time to
plan the data batch (its trigger less the tasks' run, ``addBatch``), ``latestOffset``, the tasks'
run (``addBatch``) and the time after the data batches (the last trigger, which ends the query).

Then: the cost of an idle trigger on the drained stream (the default ``shardsPerTask``); the
driver's probe sweep alone, outside Spark (each shard probed with a new iterator, as before,
and with the iterator kept from the last probe); the driver's memory (RSS of the Spark JVM,
which in local mode holds the executors too, and of the Python processes under it, sampled
during every query; the JVM heap in use after the run); kinesalite's CPU while the boto3 loop
drains (a core's worth means kinesalite is the ceiling). With ``--cluster`` the same runs
on a standalone cluster (tests/support/spark_cluster.py: a Master and 2 Workers of 1 core).

Kinesalite saturation: before loading, the stream is created and probed; if kinesalite cannot
create or answer for ``--shards`` shards (an error, or a probe sweep over
``--max-sweep-seconds``), the run halves the shard count (never below 64) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import spark_source as base

RESULT_NAME = "spark_source-scale.json"
"""The docs' marker ``bench:spark_source@scale`` renders it (spark_source.render)."""


class MemorySampler:
    """Peak RSS of this process's Java child (the Spark JVM) and of the Python processes
    under it, sampled every 0.2 s while running."""

    def __init__(self) -> None:
        self.jvm_peak = 0
        self.python_peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.2):
            try:
                # The driver's JVM (spark-submit), not a standalone cluster's Master or Workers.
                jvms = [
                    c
                    for c in me.children()
                    if "java" in c.name() and "SparkSubmit" in " ".join(c.cmdline())
                ]
                for jvm in jvms:
                    self.jvm_peak = max(self.jvm_peak, jvm.memory_info().rss)
                    pythons = [
                        p for p in jvm.children(recursive=True) if "python" in p.name().lower()
                    ]
                    self.python_peak = max(
                        self.python_peak, sum(p.memory_info().rss for p in pythons)
                    )
            except psutil.Error:
                continue


def stream_run(
    spark: Any, endpoint: str, stream: str, work: Path, run: str, per_task: str
) -> tuple[float, Any, dict[str, float]]:
    """Like spark_source.spark_stream, with ``shardsPerTask`` and the data batch's planning."""
    reader = spark.readStream.format("shardflow").options(**base.source_options(endpoint, stream))
    if per_task != "auto":
        reader = reader.option("shardsPerTask", per_task)
    df = reader.option("metadataPath", str(work / f"{run}-meta")).load()
    df = df.selectExpr(base.ID_COLUMN)
    batches: dict[int, Any] = {}

    def keep(batch: Any, batch_id: int) -> None:
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
    progress = list(query.recentProgress)
    first = min(
        datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in progress
    )
    with_rows = [p for p in progress if p["numInputRows"]]
    durations = [p["durationMs"] for p in with_rows]
    triggers_ms = float(sum(d.get("triggerExecution", 0) for d in durations))
    more = {
        "query_start_seconds": first - called,
        "batches": float(len(with_rows)),
        "plan_ms": float(
            sum(d.get("triggerExecution", 0) - d.get("addBatch", 0) for d in durations)
        ),
        "latest_offset_ms": float(sum(d.get("latestOffset", 0) for d in durations)),
        # The tasks' run with the foreachBatch function (Spark's addBatch).
        "add_batch_ms": float(sum(d.get("addBatch", 0) for d in durations)),
        # After the data batches: the trigger that finds nothing more and ends the query.
        "after_batches_ms": max(0.0, (ended - first) * 1000 - triggers_ms),
    }
    import pyarrow as pa

    ids = pa.chunked_array(
        [chunk for _, column in sorted(batches.items()) for chunk in column.chunks], pa.int64()
    )
    return ended - first, ids, more


def probe_sweeps(endpoint: str, stream: str, rounds: int = 5) -> dict[str, float]:
    """The driver's probe of every shard of ``stream`` (as latestOffset does on an idle
    stream), median ms: new iterators every time (as before), and iterators kept from the
    previous sweep. One record is put into each shard and every shard probed after it."""
    import boto3

    from shardflow.aws import AwsSettings, ClientFactory
    from shardflow.spark.source.positions import ShardPosition
    from shardflow.spark.source.probe import ProbeIterators, shards_with_records

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name=base.REGION)
    listed = client.list_shards(StreamName=stream)
    shards = list(listed["Shards"])
    while listed.get("NextToken"):
        listed = client.list_shards(NextToken=listed["NextToken"])
        shards += listed["Shards"]
    positions: dict[str, ShardPosition] = {}
    for shard in shards:
        put = client.put_record(
            StreamName=stream,
            Data=b"probe",
            PartitionKey="probe",
            ExplicitHashKey=shard["HashKeyRange"]["StartingHashKey"],
        )
        positions[put["ShardId"]] = ShardPosition.after(put["SequenceNumber"])

    async def main() -> dict[str, float]:
        aws = AwsSettings(endpoint_url=endpoint, region=base.REGION)
        async with ClientFactory(aws).kinesis() as kinesis:
            timings: dict[str, list[float]] = {"fresh": [], "kept": []}
            iterators = ProbeIterators()
            await shards_with_records(kinesis, stream, positions, None, iterators)
            for _ in range(rounds):
                for kind in ("fresh", "kept"):
                    kept = iterators if kind == "kept" else None
                    started = time.perf_counter()
                    found = await shards_with_records(kinesis, stream, positions, None, kept)
                    timings[kind].append((time.perf_counter() - started) * 1000)
                    assert not found, f"an idle stream has records in {sorted(found)[:3]}"
            return {
                "shards": float(len(positions)),
                "fresh_iterators_ms": round(statistics.median(timings["fresh"]), 1),
                "kept_iterators_ms": round(statistics.median(timings["kept"]), 1),
            }

    return asyncio.run(main())


def kinesalite_cpu(server: Any) -> Callable[[], float]:
    """A function giving kinesalite's CPU seconds so far (its node process and children)."""
    import psutil

    pid = getattr(server, "pid", None)
    process = psutil.Process(pid) if pid else None

    def seconds() -> float:
        if process is None:
            return float("nan")
        total = 0.0
        for p in [process, *process.children(recursive=True)]:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    return seconds


def fits(endpoint: str, shards: int, limit_s: float) -> tuple[bool, str]:
    """Whether kinesalite creates a stream of ``shards`` shards and probes them all in time."""
    name = f"bench-fit-{shards}"
    try:
        base.create_stream(endpoint, name, shards)
        started = time.perf_counter()
        sweep = probe_sweeps(endpoint, name, rounds=1)
        took = time.perf_counter() - started
    except Exception as error:  # any failure of the emulator at this size
        return False, f"{shards} shards: {type(error).__name__}: {error}"
    if took > limit_s:
        return False, f"{shards} shards: a probe sweep took {took:.1f} s (limit {limit_s} s)"
    return True, f"{shards} shards: created, probe sweep {sweep['fresh_iterators_ms']:.0f} ms"


def start_session(master: str | None, cluster: Any = None) -> Any:
    from pyspark.sql import SparkSession

    import shardflow.spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("shardflow-bench-spark-scale")
    if cluster is not None:
        for key, value in cluster.session_config().items():
            builder = builder.config(key, value)
    else:
        builder = builder.master(master or "local[2]").config("spark.ui.enabled", "false")
    spark = builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    shardflow.spark.register(spark)
    return spark


def jvm_heap_used(spark: Any) -> int:
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    return int(runtime.totalMemory() - runtime.freeMemory())


def run_where(
    where: str,
    spark: Any,
    endpoint: str,
    streams: dict[str, str],
    work: Path,
    args: argparse.Namespace,
    kinesalite_seconds: Callable[[], float],
) -> dict[str, Any]:
    per_tasks = args.shards_per_task.split(",")
    rows: list[dict[str, Any]] = []
    sampler = MemorySampler()
    # Warm up the workers on this master.
    stream_run(spark, endpoint, streams["plain"], work, f"{where}-warm", per_tasks[0])
    with sampler:
        for variant, stream in streams.items():
            contenders: dict[str, Callable[[int], tuple[Any, ...]]] = {}

            def loop(_: int, stream: str = stream, variant: str = variant) -> tuple[Any, ...]:
                before = kinesalite_seconds()
                seconds, ids = base.boto3_loop(endpoint, stream, variant == "aggregated")
                return seconds, ids, {"kinesalite_cpu": (kinesalite_seconds() - before) / seconds}

            contenders["boto3 GetRecords loop"] = loop
            for per_task in per_tasks:

                def source(
                    r: int, stream: str = stream, per_task: str = per_task
                ) -> tuple[Any, ...]:
                    return stream_run(
                        spark, endpoint, stream, work, f"{where}-{stream}-{per_task}-{r}", per_task
                    )

                contenders[f"source, shardsPerTask={per_task}"] = source
            rows += base.measure(variant, contenders, args.repeat, args.records)
    idle = base.idle_triggers(
        spark,
        endpoint,
        streams["plain"],
        work,
        f"{where}-{streams['plain']}-{per_tasks[0]}-0",
        args.idle_seconds,
    )
    print(where, json.dumps(idle), flush=True)
    return {
        "where": where,
        "results": rows,
        "idle_trigger": idle,
        "memory": {
            "jvm_rss_peak_mib": round(sampler.jvm_peak / 2**20),
            "python_under_jvm_rss_peak_mib": round(sampler.python_peak / 2**20),
            "jvm_heap_used_mib": round(jvm_heap_used(spark) / 2**20),
        },
    }


def main_scale(args: argparse.Namespace) -> None:
    import subprocess
    import tempfile

    from shardflow.local import KinesaliteServer
    from shardflow.spark.source.options import shards_per_task_for

    commit = (
        os.environ.get("SHARDFLOW_BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    notes: list[str] = []
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="shardflow-bench-spark-scale-") as tmp,
        KinesaliteServer(log_dir=Path(tmp), shard_limit=max(1000, 2 * args.shards)) as server,
    ):
        work = Path(tmp)
        endpoint = server.endpoint_url
        cpu = kinesalite_cpu(server)
        shards = args.shards
        while True:
            ok, note = fits(endpoint, shards, args.max_sweep_seconds)
            notes.append(note)
            print(note, flush=True)
            if ok or shards // 2 < 64:
                break
            shards //= 2
        if shards != args.shards:
            notes.append(f"kinesalite could not hold {args.shards} shards here: ran {shards}")
        streams: dict[str, str] = {}
        for variant in ("plain", "aggregated"):
            stream = f"bench-scale-{variant}"
            load_s = base.preload(
                endpoint, stream, shards, args.records, args.size, variant == "aggregated"
            )
            print(f"preloaded {args.records:,} records into {stream} in {load_s:.1f}s", flush=True)
            streams[variant] = stream
        sweep = probe_sweeps(endpoint, f"bench-fit-{shards}")
        print("probe sweep", json.dumps(sweep), flush=True)

        def save() -> dict[str, Any]:
            """The JSON so far (written after each master: a failed cluster run keeps local's)."""
            payload = {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "commit": commit,
                "machine": {"cpus": os.cpu_count()},
                "records": args.records,
                "record_bytes": args.size,
                "shards_asked": args.shards,
                "shards": shards,
                "auto_shards_per_task": shards_per_task_for(shards, None),
                "rounds": args.repeat,
                "notes": notes,
                "probe_sweep": sweep,
                "runs": runs,
            }
            base.RESULTS.mkdir(exist_ok=True)
            (base.RESULTS / RESULT_NAME).write_text(json.dumps(payload, indent=2) + "\n")
            return payload

        spark = start_session("local[2]")
        runs.append(run_where("local[2]", spark, endpoint, streams, work, args, cpu))
        spark.stop()
        payload = save()
        if args.cluster:
            sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
            from support.spark_cluster import StandaloneCluster

            try:
                with StandaloneCluster(work / "cluster", env=dict(os.environ)) as cluster:
                    spark = start_session(None, cluster)
                    cluster_args = argparse.Namespace(**vars(args))
                    cluster_args.shards_per_task = args.cluster_shards_per_task
                    runs.append(
                        run_where(
                            "standalone, 2 workers x 1 core",
                            spark,
                            endpoint,
                            streams,
                            work,
                            cluster_args,
                            cpu,
                        )
                    )
                    spark.stop()
            except Exception as error:  # the local figures stand; say what failed
                notes.append(f"the standalone cluster run failed: {type(error).__name__}: {error}")
            payload = save()
    print("\n" + render_scale(payload))
    print(f"wrote {base.RESULTS / RESULT_NAME}")


def render_scale(result: dict[str, Any]) -> str:
    """The tables of a ``--scale`` run, from its JSON (bench/tables.py puts them in the docs)."""
    lines = [
        f"{result['records']:,} x {result['record_bytes']} B records, {result['shards']} shards "
        f"on kinesalite, median of {result['rounds']} round(s), order rotated, every id checked "
        f"(commit {result['commit']}; auto shardsPerTask = {result['auto_shards_per_task']})",
    ]
    lines += [f"- {note}" for note in result["notes"]]
    for run in result["runs"]:
        lines += [
            "",
            f"**{run['where']}**",
            "",
            "| variant | contender | rows/s | vs boto3 loop | seconds | plan the data batch, ms "
            "| of which latestOffset, ms | tasks (addBatch), ms | last trigger, ms | record ids |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in run["results"]:
            rate = "failed" if r["rows_per_second"] is None else f"{r['rows_per_second']:,}"
            ratio = "" if r["ratio_to_boto3"] is None else f"{r['ratio_to_boto3']:.2f}x"
            ids = (
                "each once"
                if r["verified"]
                else f"{r['lost']:,} lost, {r['duplicates']:,} duplicated"
            )
            plan = "" if r.get("plan_ms") is None else f"{r['plan_ms']:,.0f}"
            latest = "" if r.get("latest_offset_ms") is None else f"{r['latest_offset_ms']:,.0f}"
            tasks = "" if r.get("add_batch_ms") is None else f"{r['add_batch_ms']:,.0f}"
            after = "" if r.get("after_batches_ms") is None else f"{r['after_batches_ms']:,.0f}"
            lines.append(
                f"| {r['variant']} | {r['contender']} | {rate} | {ratio} | {r['seconds']:.2f} "
                f"| {plan} | {latest} | {tasks} | {after} | {ids} |"
            )
        idle, memory = run["idle_trigger"], run["memory"]
        loop_cpu = [
            r["kinesalite_cpu"] for r in run["results"] if r.get("kinesalite_cpu") is not None
        ]
        if loop_cpu:
            lines.append(
                f"\nkinesalite used {max(loop_cpu):.2f} of a core while the boto3 loop drained"
            )
        if idle.get("median_trigger_ms") is not None:
            lines.append(
                f"\nidle trigger: median {idle['median_trigger_ms']} ms, of which latestOffset "
                f"{idle['median_latest_offset_ms']} ms ({idle['idle_triggers']} triggers)"
            )
        lines.append(
            f"\ndriver memory: Spark JVM RSS peak {memory['jvm_rss_peak_mib']:,} MiB (heap in "
            f"use after the runs {memory['jvm_heap_used_mib']:,} MiB), Python processes under it "
            f"{memory['python_under_jvm_rss_peak_mib']:,} MiB"
        )
    sweep = result["probe_sweep"]
    lines.append(
        f"\nprobe of all {sweep['shards']:.0f} shards by the driver (an idle latestOffset's work), "
        f"median: {sweep['fresh_iterators_ms']:.0f} ms with new iterators (as before), "
        f"{sweep['kept_iterators_ms']:.0f} ms with the iterators kept from the last probe"
    )
    return "\n".join(lines)
