"""Consumer throughput, CPU cost, time to first record and memory per shard, in one run.

Kinesis runs on kinesalite (its read speed holds as a stream fills), the lease table on moto's
DynamoDB. Every measured consumer runs in a child process of its own, so its CPU-seconds are its
own (the emulators' CPU is not counted for anybody).

1. drain: one stream of 200,000 x 100 B records in 4 shards is preloaded once; each contender
   drains all of it from TRIM_HORIZON (a fresh application name, so a fresh lease table) with a
   handler that only collects the record ids. Timed from the moment the consumer starts (imports
   done) to the last record handled. A contender whose ids are not exactly the 200,000 written
   posts no number. Contenders: a plain boto3 GetRecords loop (the floor), shardflow's
   consumer, async-kinesis's consumer.
2. time to first record of a brand-new application: a fresh ``python -c`` process imports
   shardflow, builds a Consumer with a never-used application name (the lease table is created)
   and handles one record of the preloaded stream. Timed from just before the parent spawns it
   (interpreter start and imports included). Also with the application's lease table in place
   (a restart).
3. scale: one process consumes a 1,000-shard stream (a few records per shard) with its 1,000
   leases on moto; resident memory before taking leases, once every lease is held and every
   shard delivered its records, and while it keeps running (renewals, idle polling).
4. starve: lease renewals on time while 8 shards drain full-size KPL aggregates, with
   ``failover_time`` 2 s: renewal lateness p50/p99/max and leases lost, against the same
   consumer idle (bench/consumer_starvation.py, its own JSON; its table ends the output).

    .venv/bin/python bench/consumer.py                  # everything (~7 minutes on 2 cores)
    .venv/bin/python bench/consumer.py --parts drain --records 20000 --repeat 1
    .venv/bin/python bench/consumer.py --parts scale --scale-shards 200 --scale-observe 20
    .venv/bin/python bench/consumer.py --parts starve   # see bench/consumer_starvation.py
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumer_starvation import lateness, percentile  # one reading of renewal times
from fleet_kit import stack_env  # the environment a user of shardflow would set

# make bench (the short mode) writes elsewhere: only full runs are the docs' figures.
RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
REGION = "us-east-1"
DRAIN_STREAM = "bench-consumer-drain"
SCALE_STREAM = "bench-consumer-scale"
ID_WIDTH = 10
STALL_SECONDS = 30.0  # a drain that handles nothing new for this long has lost records

# What the scale run changes from the defaults, and why (printed with its results): 1,000 idle
# shards polled every second would be 1,000 GetRecords/s against a single-threaded emulator.
# failover_time is the default (10 s: 1,000 renewals every 3.3 s, ~300 conditional writes/s),
# so the lease table is on dynalite by default: moto's DynamoDB does ~110 a second.
SCALE_IDLE_TIME = 10.0
# Idle shards back off to this (Polling.max_idle_time): a record put on a shard idle that long
# is read within 30 s; 1,000 idle shards cost ~33 GetRecords/s instead of 100.
SCALE_MAX_IDLE_TIME = 30.0
SCALE_LATENESS_GOAL = 0.10  # renewal lateness p99 as a share of failover_time
SCALE_CPU_GOAL = 0.05  # of one core, while watching
SCALE_QUIET_PARTS = 3  # the quiet window is measured in this many parts (a spread, a median)
LOOP_PROBE = 0.02  # seconds the scale child's loop-lateness probe sleeps at a time


def record_id(i: int) -> bytes:
    return b"%0*d" % (ID_WIDTH, i)


def payload(i: int, size: int) -> bytes:
    head = record_id(i) + b"|"
    return head + b"x" * max(0, size - len(head))


# --- what every drain contender's handler does --------------------------------------------------


class Collector:
    """Collects record ids; notes the moment (wall and CPU) the last expected id arrives."""

    def __init__(self, expected: int, on_complete: Callable[[], None] = lambda: None) -> None:
        self.expected = expected
        self.seen: set[bytes | str] = set()
        self.handled = 0
        self.leases_lost = 0  # a consumer with leases that loses one mid-drain says so
        self.done_at: float | None = None
        self.cpu_at: float | None = None
        self.last_new_at = time.monotonic()
        self.on_complete = on_complete

    def add(self, key: bytes | str) -> None:
        self.handled += 1
        seen = self.seen
        before = len(seen)
        seen.add(key)
        if len(seen) != before:
            self.last_new_at = time.monotonic()
            if len(seen) == self.expected:
                self.done_at, self.cpu_at = time.perf_counter(), time.process_time()
                self.on_complete()

    def stalled(self) -> bool:
        return time.monotonic() - self.last_new_at > STALL_SECONDS

    def verdict(self) -> dict[str, int]:
        found = {k if isinstance(k, bytes) else k.encode() for k in self.seen}
        expected = {record_id(i) for i in range(self.expected)}
        return {
            "handled": self.handled,
            "distinct": len(found),
            "missing": len(expected - found),
            "unexpected": len(found - expected),
            "duplicates": self.handled - len(self.seen),
            "leases_lost": self.leases_lost,
        }


# --- drain contenders (run inside the child process) -------------------------------------------


def drain_boto3(args: argparse.Namespace, collector: Collector) -> None:
    """The floor: the loop people write by hand, the 4 shards in turn, until each is caught up."""
    import boto3

    client = boto3.client("kinesis", endpoint_url=args.kinesis, region_name=REGION)
    shards = client.list_shards(StreamName=args.stream)["Shards"]
    iterators = {
        s["ShardId"]: client.get_shard_iterator(
            StreamName=args.stream, ShardId=s["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for s in shards
    }
    while iterators:
        for shard_id, iterator in list(iterators.items()):
            response = client.get_records(ShardIterator=iterator, Limit=10_000)
            for record in response["Records"]:
                collector.add(record["Data"][:ID_WIDTH])
            following = response.get("NextShardIterator")
            if not response["Records"] or following is None:
                del iterators[shard_id]  # caught up (a drain stops there) or ended
            else:
                iterators[shard_id] = following


def drain_shardflow(args: argparse.Namespace, collector: Collector, *, batch: bool) -> None:
    """shardflow's consumer with default settings; endpoints from AWS_ENDPOINT_URL_* variables."""
    from shardflow.consumer import ConsumedRecord, Consumer
    from shardflow.events import DiagnosticEvent, LeaseLost

    def on_event(event: DiagnosticEvent) -> None:
        if isinstance(event, LeaseLost):
            collector.leases_lost += 1

    consumer = Consumer(args.stream, args.application, on_event=on_event)
    collector.on_complete = consumer.request_stop
    add = collector.add

    async def each(record: ConsumedRecord[bytes]) -> None:
        add(record.data[:ID_WIDTH])

    async def many(records: list[ConsumedRecord[bytes]]) -> None:
        for record in records:
            add(record.data[:ID_WIDTH])

    async def main() -> None:
        async def watchdog() -> None:
            while not collector.stalled():  # noqa: ASYNC110 - a stall is an absence of events
                await asyncio.sleep(1)
            consumer.request_stop()

        guard = asyncio.create_task(watchdog())
        try:
            if batch:
                await consumer.consume(many, batch=True)
            else:
                await consumer.consume(each)
        finally:
            guard.cancel()

    asyncio.run(main())


def drain_async_kinesis(args: argparse.Namespace, collector: Collector) -> None:
    """async-kinesis's Consumer: its defaults, except a string processor (the payloads are not
    JSON) and GetRecords at Kinesis' 5 calls/s per shard (its default is 1)."""
    from kinesis import Consumer, StringProcessor

    async def main() -> None:
        async with Consumer(
            args.stream,
            endpoint_url=args.kinesis,
            region_name=REGION,
            processor=StringProcessor(),
            shard_fetch_rate=5,
        ) as consumer:
            # Iteration ends whenever its queue stays empty for idle_timeout (2 s): go on
            # until every record arrived or nothing new came for STALL_SECONDS.
            while collector.done_at is None and not collector.stalled():
                async for item in consumer:
                    collector.add(item[:ID_WIDTH])
                    if collector.done_at is not None:
                        break

    asyncio.run(main())


DRAINS: dict[str, Callable[[argparse.Namespace, Collector], None]] = {
    "boto3 GetRecords loop": drain_boto3,
    "shardflow consumer": lambda a, c: drain_shardflow(a, c, batch=False),
    "shardflow consumer (batch handler)": lambda a, c: drain_shardflow(a, c, batch=True),
    "async-kinesis consumer": drain_async_kinesis,
}
# The real KCL (bench/kcl_runs.py), by the name of its release in tests/support/kcl.
KCL_RELEASES = {"KCL 2.5.8 MultiLangDaemon": "KCL_2", "KCL 3.1.3 MultiLangDaemon": "KCL_3"}
KCL_BASELINE = "KCL 2.5.8 MultiLangDaemon"
KCL_NOTE = (
    "Python record processors (kclpy, one process per shard) under the MultiLangDaemon JVM, "
    "polling, checkpoint every 1,000 records or 5 s, KCL 2.x's lease table seeded as a previous "
    "run leaves it (KCL 3.x makes its own); timed from its first record processor's start (a lease taken, nothing read yet) to its "
    "last record handled (JVM start excluded), "
    "CPU of the JVM and its processors"
)
DRAIN_NOTES = {
    **dict.fromkeys(KCL_RELEASES, KCL_NOTE),
    "boto3 GetRecords loop": "sequential over the shards, Limit 10,000, no leases or checkpoints",
    "shardflow consumer": "default settings (polling, 10,000 per call, leases and checkpoints "
    "every 1,000 records or 5 s on moto; the time includes creating the lease table); "
    "async per-record handler",
    "shardflow consumer (batch handler)": "as above, one async call per fetched chunk",
    "async-kinesis consumer": "StringProcessor, shard_fetch_rate=5, in-memory checkpointer "
    "(its DynamoDB checkpointer needs aioboto3, not installed): no leases",
}


def drain_child(args: argparse.Namespace) -> None:
    contender = DRAINS[args.child_drain]
    if args.child_drain.startswith("async-kinesis"):
        import kinesis  # noqa: F401 - imported before the clock starts, like the others
    elif args.child_drain.startswith("shardflow"):
        import shardflow.consumer.consumer  # noqa: F401
    else:
        import boto3  # noqa: F401
    collector = Collector(args.records)
    cpu0, t0 = time.process_time(), time.perf_counter()
    error = None
    try:
        contender(args, collector)
    except Exception as exc:  # reported, not raised: the parent prints why it posts no number
        error = f"{type(exc).__name__}: {exc}"
    done_at = collector.done_at or time.perf_counter()
    cpu_at = collector.cpu_at or time.process_time()
    print(
        json.dumps(
            {"seconds": done_at - t0, "cpu_seconds": cpu_at - cpu0, "error": error}
            | {"rss_mib": rss_mib()}
            | collector.verdict()
        )
    )


# --- scale (run inside the child process) -----------------------------------------------------


@dataclass
class ScaleProbe:
    """What the scale child watches: leases, records, events, memory."""

    shards: int
    records: int
    acquired: int = 0
    renewed: int = 0
    lost: int = 0
    checkpoints: int = 0
    all_leases_at: float | None = None
    all_records_at: float | None = None
    samples: list[tuple[float, float]] = field(default_factory=list)


def rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / (1024 * 1024)


def scale_child(args: argparse.Namespace) -> None:
    from shardflow.aws import AwsSettings, ClientFactory
    from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
    from shardflow.events import (
        CheckpointWritten,
        DiagnosticEvent,
        HeartbeatBeat,
        LeaseAcquired,
        LeaseLost,
        LeaseRenewed,
    )
    from shardflow.fetch.polling import Polling
    from shardflow.leases import DynamoDBLeaseStore
    from shardflow.leases.settings import LeaseSettings

    probe = ScaleProbe(args.scale_shards, args.scale_shards * args.scale_records)
    collector = Collector(probe.records)
    leases = LeaseSettings(failover_time=args.scale_failover)
    polling = Polling(idle_time=SCALE_IDLE_TIME, max_idle_time=args.scale_max_idle)
    settings = ConsumerSettings(leases=leases, fetch=polling)
    # Renewal times per lease while watching (lateness), and the records put meanwhile.
    renewals: dict[str, list[float]] = {}
    # Where a late renewal waited: when each was sent (done - its write's duration), the
    # writes' durations, the event loop's lateness (a probe), full collections' pauses.
    renewal_sends: dict[str, list[float]] = {}
    renewal_writes: list[float] = []
    loop_lags: list[float] = []
    gc_pauses: list[float] = []
    beats: dict[str, list[float]] = {}  # the heartbeat's written beats, the same way
    beats_failed = {"n": 0}
    watching = {"now": False}
    last_renewal = {"at": time.monotonic()}
    flow_base = probe.records
    flow_seen: set[int] = set()

    async def main() -> dict[str, Any]:
        factory = ClientFactory(AwsSettings(region=REGION))
        async with factory.kinesis() as kinesis, factory.dynamodb() as dynamodb:
            # Both clients made one call (service models loaded, connections open): the
            # consumer is built and idle, nothing leased yet. This is the baseline.
            await kinesis.describe_stream_summary(StreamName=args.stream)
            await dynamodb.list_tables()
            # Every call of the consumer's two clients, by operation (what the quiet window
            # costs, source by source).
            calls: collections.Counter[str] = collections.Counter()

            def count(model: Any, **_: Any) -> None:
                calls[model.name] += 1

            kinesis.meta.events.register("before-call", count)
            dynamodb.meta.events.register("before-call", count)
            # The garbage collector's passes, by generation, with their CPU time.
            gc_times: dict[int, list[float]] = {}
            gc_started = {"at": 0.0, "wall": 0.0}

            def on_gc(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    gc_started["at"] = time.process_time()
                    gc_started["wall"] = time.perf_counter()
                else:
                    spent = time.process_time() - gc_started["at"]
                    gc_times.setdefault(info["generation"], []).append(spent)
                    if watching["now"] and info["generation"] == 2:
                        gc_pauses.append(time.perf_counter() - gc_started["wall"])

            gc.callbacks.append(on_gc)
            store = DynamoDBLeaseStore(dynamodb, args.application)
            if args.scale_lease_mode == "heartbeat":
                # The application's mode is stored in its table before any worker starts.
                await store.ensure_table()
                await store.set_lease_mode("heartbeat")
            t0 = time.perf_counter()

            def on_event(event: DiagnosticEvent) -> None:
                if isinstance(event, LeaseAcquired):
                    probe.acquired += 1
                    if probe.acquired == probe.shards:
                        probe.all_leases_at = time.perf_counter() - t0
                elif isinstance(event, LeaseRenewed):
                    probe.renewed += 1
                    last_renewal["at"] = time.monotonic()
                    if watching["now"]:
                        now = time.monotonic()
                        renewals.setdefault(event.lease_key, []).append(now)
                        renewal_sends.setdefault(event.lease_key, []).append(now - event.duration)
                        renewal_writes.append(event.duration)
                elif isinstance(event, HeartbeatBeat):
                    if watching["now"] and event.outcome == "written":
                        beats.setdefault(event.worker_id, []).append(time.monotonic())
                    elif watching["now"]:
                        beats_failed["n"] += 1
                elif isinstance(event, LeaseLost):
                    probe.lost += 1
                elif isinstance(event, CheckpointWritten):
                    probe.checkpoints += 1

            consumer = Consumer(
                args.stream,
                args.application,
                settings=settings,
                kinesis=kinesis,
                lease_store=store,
                on_event=on_event,
            )
            baseline = rss_mib()

            async def handle(record: ConsumedRecord[bytes]) -> None:
                number = int(record.data[:ID_WIDTH])
                if number >= flow_base:
                    flow_seen.add(number)
                    return
                collector.add(record.data[:ID_WIDTH])
                if collector.done_at is not None and probe.all_records_at is None:
                    probe.all_records_at = time.perf_counter() - t0

            running = asyncio.create_task(consumer.consume(handle))

            async def probe_loop() -> None:
                # How late the event loop wakes a 20 ms sleeper: what any renewal waits on top
                # of its write when the loop is busy (or stopped by a collection).
                while True:
                    asked = time.perf_counter()
                    await asyncio.sleep(LOOP_PROBE)
                    if watching["now"]:
                        loop_lags.append(time.perf_counter() - asked - LOOP_PROBE)

            prober = asyncio.create_task(probe_loop())
            deadline = time.monotonic() + args.scale_timeout
            while probe.all_records_at is None or probe.all_leases_at is None:
                if running.done() or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            ready = probe.all_records_at is not None and probe.all_leases_at is not None
            if ready and args.scale_lease_mode == "heartbeat":
                # The heartbeat takes over from lease-by-lease renewals once every peer can have
                # seen it (a take interval): watch from when the renewals have stopped.
                settle_until = time.monotonic() + 60
                while time.monotonic() < settle_until and (  # noqa: ASYNC110 - bounded
                    consumer.status().lease_mode != "heartbeat"
                    or time.monotonic() - last_renewal["at"] < 2 * leases.renew_every
                ):
                    await asyncio.sleep(0.5)
            at_ready = rss_mib()
            watching["now"] = True
            shards = (await kinesis.list_shards(StreamName=args.stream))["Shards"]
            keys = [shard["HashKeyRange"]["StartingHashKey"] for shard in shards]
            # First no records at all: the idle cost (after idle shards' polls backed off to
            # max_idle_time), then records flowing.
            quiet_cpu = quiet_window = 0.0
            quiet_windows: list[float] = []
            quiet_calls: dict[str, int] = {}
            quiet_gc: dict[str, dict[str, float]] = {}
            if ready and args.scale_quiet > 0:
                await asyncio.sleep(args.scale_max_idle or 0.0)
                calls.clear()
                gc_times.clear()
                profiler = start_profiler(args.scale_profile, args.scale_quiet)
                quiet0, quiet_at = time.process_time(), time.perf_counter()
                # The window in parts: a spread (and a median) from one run.
                part = args.scale_quiet / SCALE_QUIET_PARTS
                for _ in range(SCALE_QUIET_PARTS):
                    part_cpu, part_at = time.process_time(), time.perf_counter()
                    await asyncio.sleep(part)
                    quiet_windows.append(
                        (time.process_time() - part_cpu) / (time.perf_counter() - part_at)
                    )
                quiet_cpu = time.process_time() - quiet0
                quiet_window = time.perf_counter() - quiet_at
                if profiler is not None:
                    profiler.wait(timeout=60)
                quiet_calls = dict(calls)
                quiet_gc = {
                    str(gen): {"count": len(spans), "cpu_seconds": sum(spans)}
                    for gen, spans in sorted(gc_times.items())
                }
            renewed0, cpu0, window0 = probe.renewed, time.process_time(), time.perf_counter()
            observe_until = time.monotonic() + (args.scale_observe if ready else 0)
            flow = asyncio.create_task(
                put_flow(kinesis, args.stream, keys, flow_base, args.scale_flow, observe_until)
            )
            while time.monotonic() < observe_until and not running.done():
                await asyncio.sleep(args.scale_sample)
                probe.samples.append((time.perf_counter() - t0, rss_mib()))
            window = time.perf_counter() - window0
            idle_cpu = time.process_time() - cpu0
            watching["now"] = False
            # The mode the consumer says it keeps its leases in (the table's, once it follows).
            consumer_mode = str(getattr(consumer.status(), "lease_mode", "per-lease"))
            flow_sent = await flow
            # The last records put are read on their shard's next poll (idle_time apart).
            flow_deadline = time.monotonic() + (args.scale_max_idle or SCALE_IDLE_TIME) + 5
            while len(flow_seen) < flow_sent and time.monotonic() < flow_deadline:  # noqa: ASYNC110 - a bounded wait on a count
                await asyncio.sleep(0.25)
            stop0 = time.perf_counter()
            prober.cancel()
            await consumer.close()
            error = None
            if running.done() and running.exception() is not None:
                error = repr(running.exception())
            await asyncio.gather(running, return_exceptions=True)
            return {
                "baseline_rss_mib": baseline,
                "ready_rss_mib": at_ready,
                "samples": probe.samples,
                "leases_held": probe.acquired,
                "all_leases_seconds": probe.all_leases_at,
                "all_records_seconds": probe.all_records_at,
                "renewals_in_window": probe.renewed - renewed0,
                "window_seconds": window,
                "idle_cpu_seconds": idle_cpu,
                "quiet_cpu_seconds": quiet_cpu,
                "quiet_window_seconds": quiet_window,
                "quiet_window_shares": quiet_windows,
                "quiet_calls": quiet_calls,
                "quiet_gc": quiet_gc,
                "max_idle_time": args.scale_max_idle,
                "leases_lost": probe.lost,
                "checkpoints": probe.checkpoints,
                "stop_seconds": time.perf_counter() - stop0,
                "error": error,
                "renew_every": leases.renew_every,
                "lateness": renewal_lateness(renewals, leases.renew_every),
                "send_lateness": renewal_lateness(renewal_sends, leases.renew_every),
                "renewal_write": spread_of(renewal_writes),
                "loop_lag": spread_of(loop_lags),
                "gc_pauses": spread_of(gc_pauses) | {"total": sum(gc_pauses)},
                "beat_lateness": renewal_lateness(beats, leases.renew_every),
                "beats_not_written": beats_failed["n"],
                "flow_sent": flow_sent,
                "flow_handled": len(flow_seen),
                "lease_mode": args.scale_lease_mode,
                "status_lease_mode": consumer_mode,
            }

    result = asyncio.run(main())
    print(json.dumps(result | collector.verdict()))


def start_profiler(path: str | None, seconds: float) -> subprocess.Popen[bytes] | None:
    """py-spy sampling this process for ``seconds`` into ``path`` (``--scale-profile``: where
    the quiet window's CPU goes); None without a path. py-spy is not a dependency: it must be
    installed in the venv (``.venv/bin/pip install py-spy``). Its own CPU is its process's,
    not the one measured."""
    if not path:
        return None
    spy = Path(sys.executable).with_name("py-spy")
    command = [str(spy), "record", "--pid", str(os.getpid()), "--duration", f"{seconds:.0f}"]
    command += ["--rate", "200", "--format", "raw", "--output", path, "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def put_flow(
    kinesis: Any, stream: str, keys: list[str], first: int, per_second: float, until: float
) -> int:
    """Records flowing while the scale run watches: ``per_second`` records a second, spread
    over every shard in turn (one PutRecords call a second), numbered from ``first``; returns
    how many were accepted. Bounded by ``until``."""
    sent, turn = 0, 0
    while time.monotonic() < until and per_second > 0:
        batch = max(1, int(per_second))
        entries: list[dict[str, Any]] = []
        for _ in range(batch):
            entries.append(
                {
                    "Data": payload(first + sent + len(entries), 100),
                    "PartitionKey": "p",
                    "ExplicitHashKey": keys[turn % len(keys)],
                }
            )
            turn += 1
        answer = await kinesis.put_records(StreamName=stream, Records=entries)
        if answer.get("FailedRecordCount"):
            raise RuntimeError(f"the flow's PutRecords failed: {answer['FailedRecordCount']}")
        sent += len(entries)
        await asyncio.sleep(1.0)
    return sent


def spread_of(values: list[float]) -> dict[str, float]:
    """p50, p99, max and count of ``values`` (seconds; zeros when there are none)."""
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
        "count": len(values),
    }


def renewal_lateness(renewals: dict[str, list[float]], interval: float) -> dict[str, float]:
    """How much later than ``interval`` after its previous one each renewal of a lease came:
    p50, p99 and max over every lease, in seconds."""
    return spread_of(lateness(renewals, interval))


# --- time to first record (a program of its own, run with python -c) --------------------------

FIRST_RECORD_PROGRAM = """
import sys, time
started = time.time()
import asyncio, json
from shardflow.consumer import Consumer
imported = time.time()
leased, first = [], []
def on_event(event):
    if not leased and type(event).__name__ == "LeaseAcquired":
        leased.append(time.time())
consumer = Consumer(sys.argv[1], sys.argv[2], on_event=on_event)
async def handle(record):
    if not first:
        first.append(time.time())
        consumer.request_stop()
asyncio.run(consumer.consume(handle))
print(json.dumps({"imported": imported, "leased": leased[0], "first": first[0]}))
"""


# --- parent: servers, data, children, tables ---------------------------------------------------


def run_child(command: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"child {command[2:5]} exited with {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def kinesis_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)


def create_stream(endpoint: str, stream: str, shards: int) -> float:
    """Create a stream and wait until ACTIVE; the seconds it took."""
    client = kinesis_client(endpoint)
    started = time.perf_counter()
    client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 600}
    )
    return time.perf_counter() - started


def put_all(endpoint: str, stream: str, entries: list[dict[str, Any]]) -> float:
    """PutRecords in batches of 500, retrying failed entries; records per second."""
    client = kinesis_client(endpoint)
    started = time.perf_counter()
    for start in range(0, len(entries), 500):
        batch = entries[start : start + 500]
        while batch:
            response = client.put_records(StreamName=stream, Records=batch)
            batch = [e for e, r in zip(batch, response["Records"], strict=True) if "ErrorCode" in r]
    return len(entries) / (time.perf_counter() - started)


@dataclass
class DrainOutcome:
    contender: str
    records: int
    seconds: float
    cpu_seconds: float
    distinct: int
    missing: int
    unexpected: int
    duplicates: int
    leases_lost: int
    error: str | None
    rss_mib: float | None = None
    """Resident memory at the end of the drain (the KCL: its JVM and processors)."""

    @property
    def verified(self) -> bool:
        return self.error is None and self.missing == 0 and self.unexpected == 0

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_100k(self) -> float:
        return self.cpu_seconds * 100_000 / self.records


def run_drains(args: argparse.Namespace, kinesis: str, moto: str, kcl: Any) -> list[DrainOutcome]:
    everyone = [*DRAINS, *(KCL_RELEASES if args.kcl else ())]
    chosen = [c for c in everyone if not args.contenders or c in args.contenders.split(",")]
    runs: dict[str, list[DrainOutcome]] = {name: [] for name in chosen}
    env = stack_env(kinesis, moto)
    # Round-robin over the contenders, the order rotated each round, so that a noisy spell of
    # the machine (or going first) is not one contender's alone.
    for round_ in range(args.repeat):
        turn = round_ % len(chosen)
        for name in chosen[turn:] + chosen[:turn]:
            n = chosen.index(name)
            command = [
                sys.executable,
                __file__,
                "--child-drain",
                name,
                "--kinesis",
                kinesis,
                "--stream",
                DRAIN_STREAM,
                "--application",
                f"bench-drain-{os.getpid()}-{round_}-{n}",
                "--records",
                str(args.records),
            ]
            if name in KCL_RELEASES:
                application = f"bench-kcl-{os.getpid()}-{round_}-{n}"
                release = KCL_RELEASES[name]
                m = kcl.drain(
                    release, application, args.records, STALL_SECONDS, args.kcl_first_timeout
                )
            else:
                m = run_child(command, env, timeout=600)
            outcome = DrainOutcome(
                name,
                args.records,
                m["seconds"],
                m["cpu_seconds"],
                m["distinct"],
                m["missing"],
                m["unexpected"],
                m["duplicates"],
                m["leases_lost"],
                m["error"],
                m.get("rss_mib"),
            )
            runs[name].append(outcome)
            check = "verified" if outcome.verified else f"NOT VERIFIED ({outcome.error})"
            print(
                f"round {round_ + 1}: {name:36s} {outcome.records_per_second:9,.0f} rec/s  "
                f"{outcome.cpu_per_100k:5.2f} CPU-s/100k  ids {outcome.distinct:,} "
                f"(missing {outcome.missing}, duplicates {outcome.duplicates}, "
                f"leases lost {outcome.leases_lost}) {check}",
                flush=True,
            )
    return [median_drain(runs[name]) for name in chosen]


def median_drain(outcomes: list[DrainOutcome]) -> DrainOutcome:
    """Medians of the rounds' wall and CPU seconds (of two rounds: their mean); any failed
    round fails the contender."""
    failed = next((o for o in outcomes if not o.verified), None)
    base = failed or outcomes[0]
    return DrainOutcome(
        base.contender,
        base.records,
        statistics.median(o.seconds for o in outcomes),
        statistics.median(o.cpu_seconds for o in outcomes),
        base.distinct,
        base.missing,
        base.unexpected,
        max(o.duplicates for o in outcomes),
        sum(o.leases_lost for o in outcomes),
        base.error,
        None if failed else statistics.median(o.rss_mib or 0.0 for o in outcomes),
    )


def drain_table(outcomes: list[DrainOutcome], args: argparse.Namespace, order: str) -> str:
    base = next((o for o in outcomes if o.contender.startswith("boto3") and o.verified), None)
    kcl = next((o for o in outcomes if o.contender == KCL_BASELINE and o.verified), None)
    lines = [
        f"Drain: {args.records:,} records x {args.size} B from 4 shards (Kinesis on kinesalite, "
        f"leases on moto), median of {args.repeat} round(s), {order}",
        "",
        "| consumer | records/s | vs boto3 loop | CPU-s per 100k | vs boto3 loop | vs KCL 2.5.8 "
        "| RSS | verified |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        if not o.verified:
            why = o.error or f"{o.missing:,} missing, {o.unexpected:,} unexpected"
            why = why if why.startswith("not run") else f"NO: {why}"
            lines.append(f"| {o.contender} | - | - | - | - | - | - | {why} |")
            continue
        speed = f"{o.records_per_second / base.records_per_second:.2f}x" if base else "-"
        cost = f"{o.cpu_per_100k / base.cpu_per_100k:.2f}x" if base else "-"
        vs_kcl = f"{o.cpu_per_100k / kcl.cpu_per_100k:.2f}x" if kcl else "-"
        rss = f"{o.rss_mib:.0f} MiB" if o.rss_mib else "-"
        dup = f", {o.duplicates:,} duplicates" if o.duplicates else ""
        if o.leases_lost:
            dup += f", {o.leases_lost} leases lost (all rounds)"
        lines.append(
            f"| {o.contender} | {o.records_per_second:,.0f} | {speed} | {o.cpu_per_100k:.2f} | "
            f"{cost} | {vs_kcl} | {rss} | all {o.distinct:,} ids{dup} |"
        )
    lines.append("")
    lines += [f"- {name}: {DRAIN_NOTES[name]}" for name in (o.contender for o in outcomes)]
    return "\n".join(lines)


def run_first_records(args: argparse.Namespace, kinesis: str, moto: str) -> dict[str, Any]:
    env = stack_env(kinesis, moto)
    runs: dict[str, list[dict[str, float]]] = {"new application": [], "existing lease table": []}
    for attempt in range(args.first_repeat):
        application = f"bench-first-{os.getpid()}-{attempt}"
        for kind in runs:  # the second run finds the table (and released leases) of the first
            spawned = time.time()
            m = run_child(
                [sys.executable, "-c", FIRST_RECORD_PROGRAM, DRAIN_STREAM, application],
                env,
                timeout=300,
            )
            timing = {
                "total": m["first"] - spawned,
                "interpreter_and_import": m["imported"] - spawned,
                "to_first_lease": m["leased"] - m["imported"],
                "first_lease_to_first_record": m["first"] - m["leased"],
            }
            runs[kind].append(timing)
            print(
                f"first record, {kind:20s}: {timing['total']:.2f} s after spawn "
                f"(import {timing['interpreter_and_import']:.2f} s)",
                flush=True,
            )
    return {
        kind: {key: statistics.median(t[key] for t in timings) for key in timings[0]}
        | {"runs": [t["total"] for t in timings]}
        for kind, timings in runs.items()
    }


def run_kcl_first_records(args: argparse.Namespace, kcl: Any) -> dict[str, dict[str, Any]]:
    """The KCL's time to first record, from the JVM's spawn, once per kind (it takes long)."""
    from support.kcl import KclUnavailable

    results: dict[str, dict[str, Any]] = {}
    for name, release in KCL_RELEASES.items():
        try:
            kcl.install(release)
        except KclUnavailable as exc:
            results[name] = {"not run": exc.reason}
            continue
        results[name] = {}
        # The second start finds the lease table (and released leases) the first one made.
        application = f"bench-kcl-first-{os.getpid()}-{release}"
        for kind in ("new application", "existing lease table"):
            seconds = kcl.first_record(release, application, timeout=args.kcl_first_timeout)
            results[name][kind] = seconds
            shown = "not within the timeout" if seconds is None else f"{seconds:.2f} s"
            print(f"first record, {name}, {kind}: {shown} after spawn", flush=True)
    return results


def first_record_table(
    results: dict[str, Any], args: argparse.Namespace, kcl: dict[str, dict[str, Any]]
) -> str:
    lines = [
        f"Time to first record (fresh process, default settings, median of {args.first_repeat})",
        "",
        "| application | process start -> first record | interpreter + import | "
        "consumer start -> first lease | first lease -> first record | runs |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for kind, r in results.items():
        runs = ", ".join(f"{s:.2f}" for s in r["runs"])
        lines.append(
            f"| {kind} | **{r['total']:.2f} s** | {r['interpreter_and_import']:.2f} s | "
            f"{r['to_first_lease']:.2f} s | {r['first_lease_to_first_record']:.2f} s | {runs} |"
        )
    for name, kinds in kcl.items():
        if "not run" in kinds:
            lines.append(f"| {name} | not run: {kinds['not run']} | - | - | - | - |")
            continue
        for kind, seconds in kinds.items():
            shown = (
                f"not within {args.kcl_first_timeout:.0f} s"
                if seconds is None
                else f"{seconds:.2f} s"
            )
            lines.append(
                f"| {name}, {kind} | **{shown}** (JVM spawn -> first record) | - | - | - | 1 |"
            )
    lines += [
        "",
        "- new application: the lease table is created, shards listed, leases created and "
        "taken; existing: the table and the leases (released by the previous run) are there",
        "- the first GetRecords of a preloaded shard returns up to 10,000 records; the first "
        "record is handled once that batch is read and parsed",
    ]
    return "\n".join(lines)


def run_scale(args: argparse.Namespace, kinesis: str, dynamodb: str) -> dict[str, Any]:
    shards = args.scale_shards
    created = create_stream(kinesis, SCALE_STREAM, shards)
    client = kinesis_client(kinesis)
    started = time.perf_counter()
    listed = client.list_shards(StreamName=SCALE_STREAM)["Shards"]
    listing = time.perf_counter() - started
    if len(listed) != shards:
        raise RuntimeError(f"ListShards returned {len(listed)} of {shards} shards")
    entries = [
        {
            "Data": payload(n * args.scale_records + k, args.size),
            "PartitionKey": "p",
            "ExplicitHashKey": shard["HashKeyRange"]["StartingHashKey"],
        }
        for n, shard in enumerate(listed)
        for k in range(args.scale_records)
    ]
    put_all(kinesis, SCALE_STREAM, entries)
    print(
        f"scale stream: {shards:,} shards created in {created:.1f} s, listed in {listing:.2f} s, "
        f"{len(entries):,} records",
        flush=True,
    )
    command = [
        sys.executable,
        __file__,
        "--child-scale",
        "--stream",
        SCALE_STREAM,
        "--application",
        f"bench-scale-{os.getpid()}",
        "--scale-shards",
        str(shards),
        "--scale-records",
        str(args.scale_records),
        "--scale-observe",
        str(args.scale_observe),
        "--scale-sample",
        str(args.scale_sample),
        "--scale-timeout",
        str(args.scale_timeout),
        "--scale-failover",
        str(args.scale_failover),
        "--scale-flow",
        str(args.scale_flow),
        "--scale-lease-mode",
        args.scale_lease_mode,
        "--scale-quiet",
        str(args.scale_quiet),
        *(["--scale-max-idle", str(args.scale_max_idle)] if args.scale_max_idle else []),
        *(["--scale-profile", args.scale_profile] if args.scale_profile else []),
    ]
    timeout = args.scale_timeout + args.scale_observe + args.scale_quiet + 400
    m = run_child(command, stack_env(kinesis, dynamodb), timeout=timeout)
    m |= {"create_seconds": created, "list_seconds": listing}
    return m


def quiet_parts(m: dict[str, Any]) -> str:
    """The quiet window's parts, as shares of a core, and their median (newer runs)."""
    shares = m.get("quiet_window_shares") or []
    if len(shares) < 2:
        return ""
    each = " / ".join(f"{share * 100:.1f}" for share in shares)
    return (
        f"; {len(shares)} parts of {m['quiet_window_seconds'] / len(shares):.0f} s: {each}%, "
        f"median {statistics.median(shares) * 100:.1f}%"
    )


def scale_table(m: dict[str, Any], args: argparse.Namespace) -> str:
    shards = args.scale_shards
    rss = [r for _, r in m["samples"]] or [m["ready_rss_mib"]]
    base = m["baseline_rss_mib"]
    ready_kib = (m["ready_rss_mib"] - base) * 1024 / shards
    steady_kib = (max(rss) - base) * 1024 / shards
    ok = m["missing"] == 0 and m["leases_held"] >= shards and not m["error"]
    ok = ok and m.get("flow_handled", 0) == m.get("flow_sent", 0)
    leases, records = m["all_leases_seconds"], m["all_records_seconds"]
    window = m["window_seconds"]
    first_half = rss[: max(1, len(rss) // 2)]
    second_half = rss[len(rss) // 2 :]
    failover = m["failover_time"]
    renew_every = m.get("renew_every", failover / 3 - 0.025)
    server = m.get("lease_server", "moto")
    cpu_share = m["idle_cpu_seconds"] / window
    quiet_share = (
        m["quiet_cpu_seconds"] / m["quiet_window_seconds"]
        if m.get("quiet_window_seconds")
        else None
    )
    late = m.get("lateness")
    lines = [
        f"Scale, lease mode {m.get('lease_mode', 'per-lease')}: one process consumes "
        f"{shards:,} shards ({args.scale_records} records each, "
        f"kinesalite) with {shards:,} leases on {server}. Settings: failover_time "
        f"{failover:.0f} s (renew every {renew_every:.2f} s), polling idle_time "
        f"{m['idle_time']:.0f} s (1,000 shards polled every second would be 1,000 GetRecords/s "
        "against one emulator)"
        + (
            f", max_idle_time {m['max_idle_time']:.0f} s (idle shards back off to it)"
            if m.get("max_idle_time")
            else ""
        )
        + ", everything else default",
        "",
        "| | value |",
        "|---|---:|",
        f"| RSS, consumer built and idle, no leases (baseline) | {base:.1f} MiB |",
        f"| RSS, all leases held and every shard delivered | {m['ready_rss_mib']:.1f} MiB |",
        f"| RSS over the next {window:.0f} s: first half max / second half max | "
        f"{max(first_half):.1f} / {max(second_half):.1f} MiB |",
        f"| **RSS per shard** (highest RSS seen - baseline) / {shards:,} | "
        f"**{steady_kib:.0f} KiB** (at delivery: {ready_kib:.0f} KiB) |",
        f"| all {shards:,} leases held after | "
        + (f"{leases:.1f} s |" if leases is not None else "NOT REACHED |"),
        f"| all {m['distinct']:,} records delivered after | "
        + (
            f"{records:.1f} s |"
            if records is not None
            else f"NOT REACHED ({m['missing']:,} missing) |"
        ),
        f"| lease renewals while watching / leases lost | {m['renewals_in_window']:,} in "
        f"{window:.0f} s / {m['leases_lost']} |",
        *(
            [
                f"| consumer CPU, no records flowing ({m['quiet_window_seconds']:.0f} s, after "
                f"{m.get('max_idle_time') or 0:.0f} s idle) | {quiet_share * 100:.1f}% of one core "
                f"(goal {SCALE_CPU_GOAL:.0%}: "
                f"{'met' if quiet_share <= SCALE_CPU_GOAL else 'NOT MET'})" + quiet_parts(m) + " |"
            ]
            if quiet_share is not None
            else []
        ),
        *(
            [
                "| garbage collections while no records flowed (CPU) | "
                + ", ".join(
                    f"generation {gen}: {passes['count']:,} ({passes['cpu_seconds'] * 1000:.0f} ms)"
                    for gen, passes in m["quiet_gc"].items()
                )
                + " |"
            ]
            if m.get("quiet_gc")
            else []
        ),
        *(
            [
                "| calls while no records flowed, per second | "
                + ", ".join(
                    f"{name} {count / m['quiet_window_seconds']:.2f}"
                    for name, count in sorted(m["quiet_calls"].items(), key=lambda kv: -kv[1])
                )
                + " |"
            ]
            if m.get("quiet_calls")
            else []
        ),
        "| consumer CPU while watching"
        + (f" ({m['flow_per_second']:.0f} records/s flowing)" if quiet_share is not None else "")
        + f" | {cpu_share * 100:.0f}% of one core"
        + (
            f" (goal {SCALE_CPU_GOAL:.0%}: {'met' if cpu_share <= SCALE_CPU_GOAL else 'NOT MET'})"
            if quiet_share is None
            else ""
        )
        + " |",
        f"| stop: final checkpoints and {shards:,} releases | {m['stop_seconds']:.1f} s |",
        f"| stream on kinesalite: create / ListShards | {m['create_seconds']:.1f} s / "
        f"{m['list_seconds']:.2f} s |",
        f"| verified | {'yes' if ok else 'NO'}: {m['distinct']:,} distinct ids, "
        f"{m['duplicates']} duplicates |",
        *(
            [f"| lease mode the consumer reported while watching | {m['status_lease_mode']} |"]
            if "status_lease_mode" in m
            else []
        ),
    ]
    beat_late = m.get("beat_lateness")
    if beat_late is not None and beat_late["count"] > 0:
        share = beat_late["p99"] / failover
        lines.insert(
            lines.index(next(line for line in lines if line.startswith("| consumer CPU"))),
            f"| heartbeat lateness p50 / p99 / max ({beat_late['count']:,} beats, "
            f"{m.get('beats_not_written', 0)} not written) | "
            f"{beat_late['p50'] * 1000:.0f} / {beat_late['p99'] * 1000:.0f} / "
            f"{beat_late['max'] * 1000:.0f} ms "
            f"(p99 {share:.1%} of failover_time, goal {SCALE_LATENESS_GOAL:.0%}: "
            f"{'met' if share <= SCALE_LATENESS_GOAL else 'NOT MET'}) |",
        )
    if late is not None and late["count"] == 0:
        lines.insert(
            lines.index(next(line for line in lines if line.startswith("| consumer CPU"))),
            "| renewal lateness | none renewed on its own (one heartbeat item per worker keeps "
            "them)"
            + ("" if beat_late is not None else ", and this run's beats emitted no event")
            + " |",
        )
    elif late is not None:
        share = late["p99"] / failover
        lines.insert(
            lines.index(next(line for line in lines if line.startswith("| consumer CPU"))),
            f"| renewal lateness p50 / p99 / max ({late['count']:,} renewals) | "
            f"{late['p50'] * 1000:.0f} / {late['p99'] * 1000:.0f} / {late['max'] * 1000:.0f} ms "
            f"(p99 {share:.1%} of failover_time, goal {SCALE_LATENESS_GOAL:.0%}: "
            f"{'met' if share <= SCALE_LATENESS_GOAL else 'NOT MET'}) |",
        )
    waited = where_renewals_waited(m)
    if waited:
        lines.insert(
            lines.index(next(line for line in lines if line.startswith("| consumer CPU"))),
            waited,
        )
    if late is not None:
        lines.insert(
            lines.index(next(line for line in lines if line.startswith("| consumer CPU"))),
            f"| records put while watching / handled | {m['flow_sent']:,} / "
            f"{m['flow_handled']:,} ({m['flow_per_second']:.0f}/s) |",
        )
    return "\n".join(lines)


def where_renewals_waited(m: dict[str, Any]) -> str | None:
    """The table row that says where renewals waited (runs that measured it)."""
    sent, write, lag, pauses = (
        m.get(key) for key in ("send_lateness", "renewal_write", "loop_lag", "gc_pauses")
    )
    if sent is None or write is None or lag is None or pauses is None or not sent["count"]:
        return None

    def ms(value: float) -> str:
        return f"{value * 1000:.0f}"

    return (
        "| where renewals waited: sent late p99 / max; write p50 / p99; event loop late p99 / "
        f"max; full collections (pause max) | {ms(sent['p99'])} / {ms(sent['max'])} ms; "
        f"{ms(write['p50'])} / {ms(write['p99'])} ms; {ms(lag['p99'])} / {ms(lag['max'])} ms; "
        f"{pauses['count']} ({ms(pauses['max'])} ms) |"
    )


def parent(args: argparse.Namespace) -> None:
    from shardflow.local import KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    parts = args.parts.split(",")
    starvation = None
    if "starve" in parts:
        # Lease renewals while 8 shards drain 1 MiB aggregates: its own emulators and JSON
        # (consumer_starvation.json); its table is printed again at the end, with the others.
        starvation = starvation_module().run(args)
        parts = [part for part in parts if part != "starve"]
        if not parts:
            return
    payload_out: dict[str, Any] = {"benchmark": "consumer", "args": vars(args)}
    # The shard limit of kinesalite is for all streams together.
    with KinesaliteServer(shard_limit=args.scale_shards + 100) as kinesalite, MotoServer() as moto:
        kinesis, dynamodb = kinesalite.endpoint_url, moto.endpoint_url
        if "drain" in parts or "first" in parts:
            create_stream(kinesis, DRAIN_STREAM, 4)
            rate = put_all(
                kinesis,
                DRAIN_STREAM,
                [
                    {"Data": payload(i, args.size), "PartitionKey": f"pk-{i % 10_007}"}
                    for i in range(args.records)
                ],
            )
            print(f"preloaded {args.records:,} records ({rate:,.0f} records/s)", flush=True)
        kcl = None
        if args.kcl and ("drain" in parts or "first" in parts):
            from kcl_runs import KclBench

            kcl = KclBench(kinesis, dynamodb, DRAIN_STREAM)
        if "drain" in parts:
            drains = run_drains(args, kinesis, dynamodb, kcl)
            payload_out["drain_order"] = ROTATED
            payload_out["drain"] = [
                asdict(o)
                | {
                    "records_per_second": o.records_per_second,
                    "cpu_per_100k": o.cpu_per_100k,
                    "verified": o.verified,
                }
                for o in drains
            ]
        if "first" in parts:
            payload_out["first_record"] = run_first_records(args, kinesis, dynamodb)
            if kcl is not None:
                payload_out["first_record_kcl"] = run_kcl_first_records(args, kcl)
        if kcl is not None:
            kcl.close()
        if "scale" in parts:
            if args.scale_lease_server == "dynalite":
                from shardflow.local import DynaliteServer

                with DynaliteServer() as dynalite:
                    scale = run_scale(args, kinesis, dynalite.endpoint_url)
            else:
                scale = run_scale(args, kinesis, dynamodb)
            key = "scale" if args.scale_lease_mode == "per-lease" else "scale_heartbeat"
            payload_out[key] = scale | {
                "failover_time": args.scale_failover,
                "idle_time": SCALE_IDLE_TIME,
                "lease_server": args.scale_lease_server,
                "flow_per_second": args.scale_flow,
            }
    payload_out |= {
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    print("\n" + render(payload_out))
    if starvation is not None:
        print(
            "\nLease renewals while 8 shards drain 1 MiB aggregates (part starve, "
            "bench/consumer_starvation.py):\n\n" + starvation_module().render(starvation)
        )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "consumer.json"
    if args.merge and path.exists():
        # The earlier run's parts stay, with their own arguments (the tables read them).
        earlier = json.loads(path.read_text())
        measured = {k: v for k, v in payload_out.items() if k not in ("args", "benchmark")}
        payload_out = earlier | measured
    path.write_text(json.dumps(payload_out, indent=2) + "\n")


ROTATED = "order rotated each round"


def drains_of(result: dict[str, Any]) -> list[DrainOutcome]:
    names = [f.name for f in fields(DrainOutcome)]
    return [DrainOutcome(**{k: d[k] for k in names if k in d}) for d in result.get("drain", [])]


def render(result: dict[str, Any]) -> str:
    """The tables of one run, from its JSON (bench/tables.py puts them into the docs)."""
    args = argparse.Namespace(**result["args"])
    tables = []
    if "drain" in result:
        order = result.get("drain_order", "same order every round")
        tables.append(drain_table(drains_of(result), args, order))
    if "first_record" in result:
        kcl = result.get("first_record_kcl", {})
        tables.append(first_record_table(result["first_record"], args, kcl))
    if "scale" in result:
        tables.append(scale_table(result["scale"], args))
    if "scale_heartbeat" in result:
        tables.append(scale_table(result["scale_heartbeat"], args))
    return "\n\n".join([*tables, f"({result['machine']})"])


def starvation_module() -> Any:
    """bench/consumer_starvation.py (bench/ is a folder of scripts, not a package)."""
    import importlib.util

    path = Path(__file__).with_name("consumer_starvation.py")
    spec = importlib.util.spec_from_file_location("bench_consumer_starvation", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts",
        default="drain,first,scale,starve",
        help="drain,first,scale,starve (starve: lease renewal lateness, see "
        "bench/consumer_starvation.py)",
    )
    starvation_module().add_arguments(parser)
    parser.add_argument("--records", type=int, default=200_000, help="preloaded for the drain")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="drain rounds (medians)")
    parser.add_argument("--contenders", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--kcl",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the real KCL (2.5.8, 3.1.3) as drain contenders and in time to first record",
    )
    parser.add_argument(
        "--kcl-first-timeout", type=float, default=240.0, help="seconds a KCL may take to start"
    )
    parser.add_argument("--first-repeat", type=int, default=3)
    parser.add_argument("--scale-shards", type=int, default=1_000)
    parser.add_argument("--scale-records", type=int, default=5, help="records per shard")
    parser.add_argument("--scale-observe", type=float, default=90.0, help="seconds watched")
    parser.add_argument("--scale-sample", type=float, default=5.0, help="seconds between")
    parser.add_argument("--scale-timeout", type=float, default=240.0)
    parser.add_argument(
        "--scale-failover", type=float, default=10.0, help="failover_time (default: the default)"
    )
    parser.add_argument(
        "--scale-lease-server",
        choices=("dynalite", "moto"),
        default="dynalite",
        help="the scale part's lease table (moto's DynamoDB does ~110 conditional writes/s)",
    )
    parser.add_argument(
        "--scale-flow", type=float, default=100.0, help="records/s put while watching"
    )
    parser.add_argument(
        "--scale-quiet",
        type=float,
        default=60.0,
        help="seconds watched with no records flowing (idle CPU), before --scale-observe",
    )
    parser.add_argument(
        "--scale-max-idle",
        type=float,
        default=SCALE_MAX_IDLE_TIME,
        help="Polling.max_idle_time of the scale run (0: no back-off of idle shards)",
    )
    parser.add_argument(
        "--scale-lease-mode",
        choices=("per-lease", "heartbeat"),
        default="per-lease",
        help="the scale part's lease mode (heartbeat: one heartbeat item per worker)",
    )
    parser.add_argument(
        "--scale-profile",
        help="sample the scale child with py-spy over its quiet window into this file (raw "
        "collapsed stacks; py-spy must be installed in the venv)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the parts of bench/results/consumer.json this run does not measure "
        "(a heartbeat-mode scale run is stored beside the per-lease one)",
    )
    parser.add_argument("--child-drain", help=argparse.SUPPRESS)
    parser.add_argument("--child-scale", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kinesis", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--application", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_drain:
        drain_child(args)
    elif args.child_scale:
        scale_child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
