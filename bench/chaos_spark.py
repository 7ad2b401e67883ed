"""Spark chaos soak: the demo's streaming jobs on a standalone cluster under faults, checked by id.

Kinesis runs on kinesis-local (it ends split and merged shards as Kinesis does), the source's
batch ends on moto's S3; Spark reaches both through fault proxies
(``shardflow.testing.FaultProxy``) that this script drives. A Spark standalone cluster (Master and
two Workers, one core each, executors in their own JVMs) runs the demo's jobs from a driver
process of its own (``chaos_spark_driver.py``): the demo's parsed business events into a
Parquet file sink, and the demo's alerts job (large orders to the alerts stream through the
shardflow sink). A producer (the demo's event generator, shardflow's producer with KPL
aggregation, straight to kinesis-local) writes orders and payments all along. The schedule, by
default over 10 minutes (``--short``: 2 minutes, every fault class once):

- kill -9 of an executor JVM the cluster started, aimed at a micro-batch in flight (the Worker
  launches a new executor);
- kill -9 of the driver (its whole process group) with a micro-batch in flight; started again at
  once from its checkpoints, as a supervisor would;
- Kinesis brownouts (HTTP 500 on 90 % of requests) and throttling (GetRecords and the sink's
  PutRecords answered ProvisionedThroughputExceededException), S3 brownouts (500 on 90 %) and
  S3 throttling (503 SlowDown), each for N seconds;
- a split of a source shard and, later, the merge of its two children.

Each fault waits (bounded) until every query committed a batch planned after the previous
fault, so that each is measured on its own. Then the producer stops, the pipeline gets
``--drain`` seconds to catch up, and ``chaos_spark_check.py`` checks by id: every acknowledged
event exactly once in the file sink, every large order's alert in the alerts stream at least
once (extra copies attributed to a fault), no micro-batch longer than ``--batch-bound`` seconds
of driver time, and per fault: requests the proxy failed, micro-batches in flight, tasks failed
or lost with the driver, and the time until every query committed a batch planned after it.

    .venv/bin/python bench/chaos_spark.py              # 10 minutes; bench/results/chaos_spark.json
    .venv/bin/python bench/chaos_spark.py --short --results /tmp/cs.json --keep /tmp/cs

Only processes this script started are signalled, by PID (the driver by the process group it
was started in); all of them are gone when it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))

import chaos_spark_check as check  # noqa: E402
import fleet_kit  # noqa: E402
from chaos_spark_logs import in_flight, read_batches, read_tasks  # noqa: E402

RESULTS = HERE / "results"
DRIVER = HERE / "chaos_spark_driver.py"
REGION = "us-east-1"
SHARDS = 2
DEFAULT_RATE = 20.0
"""Events/s: kinesis-local slows as its streams fill (see the emulator notes), and the
cluster, the driver, two emulators and two proxies share two cores; 12,000 events in 10
minutes keeps every micro-batch small enough that a fault, not the load, sets its length."""
BATCH_BOUND = 60.0
"""Seconds a micro-batch may take while a driver runs the queries. A batch waits out at most
the longest brownout (20 s: its calls are retried inside it, the batch-end stores' for 10-15
s, then Spark retries the task), the re-run of the tasks of a lost executor elsewhere (seconds;
Spark notices the loss at once from the Worker), and its own work (2-5 s on the busy 2-core
machine): about 40 s, 60 s with room for the machine. The time from a driver's kill until the
next driver ran its first task (its JVM start and its executors' JVMs, 20-70 s here, more in a
loaded make test) does not count: no driver runs the batch then (that time is the driver
kill's recovery, reported per fault)."""

# (not before second, action, seconds it lasts) for a 600 s run; the short one for 120 s.
LONG_SCHEDULE: list[tuple[float, str, float]] = [
    (30, "executor_kill", 0),
    (70, "kinesis_brownout", 20),
    (120, "split", 0),
    (160, "driver_kill", 0),
    (230, "s3_brownout", 15),
    (280, "kinesis_throttle", 15),
    (330, "merge", 0),
    (370, "executor_kill", 0),
    (420, "s3_throttle", 10),
    (460, "driver_kill", 0),
    (520, "kinesis_brownout", 10),
]
SHORT_SCHEDULE: list[tuple[float, str, float]] = [
    (5, "executor_kill", 0),
    (12, "kinesis_brownout", 8),
    (24, "split", 0),
    (30, "driver_kill", 0),
    (55, "s3_brownout", 6),
    (65, "kinesis_throttle", 6),
    (75, "merge", 0),
    (82, "s3_throttle", 5),
]
FAULT_CLASSES = frozenset(kind for _, kind, _ in SHORT_SCHEDULE)


# --- the soak ---------------------------------------------------------------------------------


class FaultLog:
    """The faults as they happen, printed and kept (``faults.jsonl`` in the run folder)."""

    def __init__(self, path: Path, began: float) -> None:
        self.path = path
        self.began = began
        self.entries: list[check.Fault] = []
        self._lock = threading.Lock()

    def add(self, fault: check.Fault) -> None:
        with self._lock:
            self.entries.append(fault)
            with self.path.open("a") as file:
                file.write(json.dumps(_asdict(fault)) + "\n")
        extra = f", {fault.injected} requests failed" if fault.injected is not None else ""
        target = f" {fault.target}" if fault.target else ""
        print(
            f"  {fault.start - self.began:6.1f} s {fault.kind}{target} "
            f"({fault.end - fault.start:.1f} s{extra})",
            flush=True,
        )


def _asdict(fault: check.Fault) -> dict[str, Any]:
    return {name: getattr(fault, name) for name in fault.__dataclass_fields__}


class Producer:
    """The demo's event generator through shardflow's producer (KPL aggregation, per-customer
    order), straight to kinesis-local at ``rate`` events/s, in its own thread and loop; every
    event confirmed is kept with its id, every one given up on too."""

    def __init__(self, kinesis_url: str, stream: str, rate: float, total: int) -> None:
        self.kinesis_url = kinesis_url
        self.stream = stream
        self.rate = rate
        self.total = total
        self.acked: dict[str, float] = {}
        self.failed: set[str] = set()
        self.sent: set[str] = set()
        self.large_orders: set[str] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the soak
            self.error = exc

    async def _produce(self) -> None:
        from demo.events import generate_events
        from demo.ledger import is_large_order
        from shardflow.aws import AwsSettings
        from shardflow.producer import Producer as KinesisProducer
        from shardflow.producer import ProducerSettings

        settings = ProducerSettings(aggregate=True, preserve_key_order=True, linger=0.02)
        aws = AwsSettings(endpoint_url=self.kinesis_url, region=REGION)
        events = generate_events(self.total, events_per_second=self.rate)
        tick = 0.5
        per_tick = max(1, round(self.rate * tick))
        pending: list[asyncio.Task[None]] = []
        async with KinesisProducer(self.stream, settings=settings, aws=aws) as producer:
            began = time.monotonic()
            sent = 0
            while not self._stop.is_set():
                wave = [e for _, e in zip(range(per_tick), events, strict=False)]
                if not wave:
                    break
                for event in wave:
                    event_id = str(event.body["event_id"])
                    self.sent.add(event_id)
                    future = await producer.put(event.to_bytes(), event.partition_key)
                    large = is_large_order(event.body)
                    pending.append(
                        asyncio.create_task(self._confirm(future, event_id, event.body, large))
                    )
                sent += len(wave)
                pending = [t for t in pending if not t.done()]
                await asyncio.sleep(max(0.0, began + sent / self.rate - time.monotonic()))
            await asyncio.gather(*pending)

    async def _confirm(self, future: Any, event_id: str, body: dict[str, Any], large: bool) -> None:
        try:
            await future
        except Exception:  # the producer gave up on it: not acknowledged (maybe written)
            self.failed.add(event_id)
            return
        self.acked[event_id] = time.time()
        if large:
            self.large_orders.add(str(body["order_id"]))


def events_to_produce(args: argparse.Namespace, faults: int) -> int:
    """Events the producer has to give: enough to keep writing until the soak stops it (after
    the last fault's recovery and ``--quiet``), however long the soak takes within its own
    bounds: the queries' start (``--start-timeout``), every fault waiting out the previous
    one's recovery (``--settle`` each), the schedule, ``--quiet``, and ``--aim`` per fault. A
    micro-batch is planned only when there is something new to read, so once the producer
    has run dry no fault can be seen recovering: sized for the schedule alone (duration +
    120 s), it ran dry before the last faults whenever the queries started late (a loaded
    machine: 145 s instead of 70 s) and the soak ran into its time limit."""
    seconds = args.start_timeout + args.duration + faults * (args.settle + args.aim) + args.quiet
    return int(args.rate * seconds)


class Soak:
    """One soak on its own servers, proxies, cluster and driver processes."""

    QUERIES = ("events", "alerts")

    def __init__(self, args: argparse.Namespace, run_dir: Path, kinesis_url: str, moto_url: str):
        from shardflow.testing.faults import FaultProxy

        self.args = args
        self.dir = run_dir
        self.work = run_dir / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = run_dir / "events"
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.orders = f"orders-{stamp}"
        self.alerts = f"alerts-{stamp}"
        self.bucket = f"chaos-meta-{stamp}"
        self.kinesis_url = kinesis_url
        self.moto_url = moto_url
        self.kinesis_proxy = FaultProxy(kinesis_url, seed=args.seed)
        self.s3_proxy = FaultProxy(moto_url, seed=args.seed + 1)
        self.began = time.time()
        self.faults = FaultLog(run_dir / "faults.jsonl", self.began)
        self.drivers: list[check.DriverRun] = []
        self.running_since: float | None = None
        """When every query had committed a batch (the start-up's end)."""
        self.driver: subprocess.Popen[bytes] | None = None
        self.killing = False  # set while this script kills the driver: its exit is expected
        self.driver_failures: list[str] = []
        self.actions_failed: list[str] = []
        self.split_parent: str | None = None
        self.cluster: Any = None
        self.producer: Producer | None = None
        self._watch_stop = threading.Event()
        self._driver_lock = threading.Lock()

    # --- set-up -------------------------------------------------------------------------------

    def client(self, service: str, url: str) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=url,
            region_name=REGION,
            aws_access_key_id="chaos",
            aws_secret_access_key="chaos",
        )

    def prepare(self) -> None:
        kinesis = self.client("kinesis", self.kinesis_url)
        kinesis.create_stream(StreamName=self.orders, ShardCount=SHARDS)
        kinesis.create_stream(StreamName=self.alerts, ShardCount=1)
        for stream in (self.orders, self.alerts):
            self.wait_active(stream)
        self.client("s3", self.moto_url).create_bucket(Bucket=self.bucket)

    def wait_active(self, stream: str, timeout: float = 60.0) -> None:
        kinesis = self.client("kinesis", self.kinesis_url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            summary = kinesis.describe_stream_summary(StreamName=stream)
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                return
            time.sleep(0.2)
        raise TimeoutError(f"stream {stream} not ACTIVE after {timeout:g} s")

    def driver_config(self) -> dict[str, Any]:
        return {
            "spark": self.cluster.session_config(),
            "work": str(self.work),
            "kinesis": self.kinesis_proxy.url,
            "s3": self.s3_proxy.url,
            "region": REGION,
            "orders": self.orders,
            "alerts": self.alerts,
            "metadata": f"s3://{self.bucket}/chaos",
            "out": str(self.out),
        }

    # --- the driver ---------------------------------------------------------------------------

    def start_driver(self) -> None:
        log = (self.dir / "driver.log").open("ab")
        try:
            self.driver = subprocess.Popen(
                [sys.executable, str(DRIVER), json.dumps(self.driver_config())],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the driver and its JVM die together
            )
        finally:
            log.close()
        self.drivers.append(check.DriverRun(self.driver.pid, time.time(), None, "running"))

    def _driver_ended(self, how: str) -> None:
        last = self.drivers[-1]
        self.drivers[-1] = check.DriverRun(last.pid, last.started, time.time(), how)

    def kill_driver_group(self) -> None:
        driver = self.driver
        if driver is None or driver.poll() is not None:
            return
        os.killpg(driver.pid, signal.SIGKILL)  # the group this script started for the driver
        driver.wait(30)

    def watch_driver(self) -> None:
        """A driver that exits on its own (a query failed) is started again, as a supervisor
        would; the failure is recorded."""
        while not self._watch_stop.wait(1.0):
            with self._driver_lock:
                driver = self.driver
                if driver is None or self.killing or driver.poll() is None:
                    continue
                code = driver.returncode
                self._driver_ended("failed" if code else "exited")
                when = time.time() - self.began
                self.driver_failures.append(f"{when:.1f} s: the driver exited with {code}")
                print(f"  {when:6.1f} s driver exited with {code}: started again", flush=True)
                self.start_driver()

    # --- waiting --------------------------------------------------------------------------------

    def batches(self) -> list[check.Batch]:
        return read_batches(self.work, self.QUERIES)

    def committed_since(self, moment: float) -> bool:
        """Every query committed a batch planned at or after ``moment``."""
        return self.recovered(check.Fault("start", moment, moment))

    def recovered(self, fault: check.Fault) -> bool:
        """Every query committed a batch planned after ``fault`` (after a split or a merge: one
        reading a new shard)."""
        return None not in check.recovery_of(fault, self.batches(), self.QUERIES).values()

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.2)
        return condition()

    # --- faults ---------------------------------------------------------------------------------

    def aim(self) -> bool:
        """Wait (bounded) for a micro-batch in flight; True if one is."""
        return self.wait(lambda: in_flight(self.work, self.QUERIES), self.args.aim)

    def executor_kill(self, lasting: float) -> None:
        self.aim()
        victims = self.cluster.executor_pids()
        if not victims:
            raise RuntimeError("no executor JVM to kill")
        pid = victims[0]
        at = time.time()
        self.cluster.kill_executor(pid)
        self.faults.add(check.Fault("executor_kill", at, at, str(pid)))

    def driver_kill(self, lasting: float) -> None:
        self.aim()
        with self._driver_lock:
            self.killing = True
            try:
                assert self.driver is not None
                pid = self.driver.pid
                at = time.time()
                self.kill_driver_group()
                self._driver_ended("killed")
                self.faults.add(check.Fault("driver_kill", at, at, str(pid)))
                self.start_driver()
            finally:
                self.killing = False

    def _hold(self, kind: str, proxy: Any, rules: list[int], lasting: float) -> None:
        start = time.time()
        time.sleep(lasting)
        for rule in rules:
            proxy.remove(rule)
        end = time.time()
        injected = sum(proxy.injected_count(rule) for rule in rules)
        self.faults.add(check.Fault(kind, start, end, injected=injected))

    def kinesis_brownout(self, lasting: float) -> None:
        from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse

        proxy = self.kinesis_proxy
        rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), probability=0.9)
        self._hold("kinesis_brownout", proxy, [rule], lasting)

    def kinesis_throttle(self, lasting: float) -> None:
        from shardflow.testing.faults import THROTTLED, ErrorResponse

        proxy = self.kinesis_proxy
        rules = [
            proxy.add(ErrorResponse(THROTTLED), operation="GetRecords"),
            proxy.add(ErrorResponse(THROTTLED), operation="PutRecords"),
        ]
        self._hold("kinesis_throttle", proxy, rules, lasting)

    def s3_brownout(self, lasting: float) -> None:
        from shardflow.testing.faults import ErrorResponse

        proxy = self.s3_proxy
        error = ErrorResponse("InternalError", status=500, message="internal error")
        rule = proxy.add(error, service=None, probability=0.9)
        self._hold("s3_brownout", proxy, [rule], lasting)

    def s3_throttle(self, lasting: float) -> None:
        from shardflow.testing.faults import ErrorResponse

        proxy = self.s3_proxy
        error = ErrorResponse("SlowDown", status=503, message="Please reduce your request rate.")
        rule = proxy.add(error, service=None)
        self._hold("s3_throttle", proxy, [rule], lasting)

    def open_shards(self) -> list[dict[str, Any]]:
        shards = self.client("kinesis", self.kinesis_url).list_shards(StreamName=self.orders)
        return [
            s for s in shards["Shards"] if "EndingSequenceNumber" not in s["SequenceNumberRange"]
        ]

    def split(self, lasting: float) -> None:
        before = {s["ShardId"] for s in self.open_shards()}
        shard = self.open_shards()[0]
        low = int(shard["HashKeyRange"]["StartingHashKey"])
        high = int(shard["HashKeyRange"]["EndingHashKey"])
        at = time.time()
        self.client("kinesis", self.kinesis_url).split_shard(
            StreamName=self.orders,
            ShardToSplit=shard["ShardId"],
            NewStartingHashKey=str((low + high + 1) // 2),
        )
        self.wait_active(self.orders)
        new = tuple(sorted({s["ShardId"] for s in self.open_shards()} - before))
        self.split_parent = shard["ShardId"]
        self.faults.add(check.Fault("split", at, time.time(), shard["ShardId"], new_shards=new))

    def merge(self, lasting: float) -> None:
        shards = self.open_shards()
        children = sorted(
            (s for s in shards if s.get("ParentShardId") == self.split_parent),
            key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
        )
        if len(children) != 2:
            # No split before (a schedule without one): merge the first two neighbours.
            ordered = sorted(shards, key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
            children = ordered[:2]
        before = {s["ShardId"] for s in shards}
        at = time.time()
        self.client("kinesis", self.kinesis_url).merge_shards(
            StreamName=self.orders,
            ShardToMerge=children[0]["ShardId"],
            AdjacentShardToMerge=children[1]["ShardId"],
        )
        self.wait_active(self.orders)
        new = tuple(sorted({s["ShardId"] for s in self.open_shards()} - before))
        target = "+".join(c["ShardId"] for c in children)
        self.faults.add(check.Fault("merge", at, time.time(), target, new_shards=new))

    # --- the run --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from support.spark_cluster import StandaloneCluster

        self.prepare()
        rate = self.args.rate
        total = events_to_produce(self.args, len(self.schedule()))
        self.producer = Producer(self.kinesis_url, self.orders, rate, total)
        watcher = threading.Thread(target=self.watch_driver, name="driver-watch", daemon=True)
        with (
            self.kinesis_proxy,
            self.s3_proxy,
            StandaloneCluster(self.dir / "cluster", workers=2, cores_per_worker=1) as cluster,
        ):
            self.cluster = cluster
            try:
                self.producer.start()
                self.start_driver()
                watcher.start()
                warm = time.time()
                if not self.wait(lambda: self.committed_since(warm), self.args.start_timeout):
                    raise RuntimeError(
                        f"the queries committed nothing in {self.args.start_timeout:g} s; "
                        f"see {self.dir / 'driver.log'}"
                    )
                self.running_since = time.time()
                print(f"queries running after {self.running_since - self.began:.0f} s", flush=True)
                self.play(self.schedule())
                self.quiet(self.args.quiet)
                self.producer.stop()
                drained_after = self.drain()
                stopped = time.time()
                self.stop_driver()
                return self.result(drained_after, stopped)
            finally:
                self._watch_stop.set()
                self.producer.stop()
                with self._driver_lock:
                    self.killing = True
                    self.kill_driver_group()

    def schedule(self) -> list[tuple[float, str, float]]:
        base = SHORT_SCHEDULE if self.args.duration <= 300 else LONG_SCHEDULE
        length = 120.0 if base is SHORT_SCHEDULE else 600.0
        scale = self.args.duration / length
        return [
            (at * scale, kind, lasting) for at, kind, lasting in base if kind not in self.args.skip
        ]

    def play(self, schedule: list[tuple[float, str, float]]) -> None:
        """Each fault at its time, not before every query committed a batch planned after the
        previous fault ended (bounded by ``--settle``); faults run one at a time."""
        began = time.time()
        for at, kind, lasting in schedule:
            wait = began + at - time.time()
            if wait > 0:
                time.sleep(wait)
            last = self.faults.entries[-1] if self.faults.entries else None
            settled = last is None or self.wait(
                functools.partial(self.recovered, last), self.args.settle
            )
            if not settled:
                print(f"  {kind}: the queries had not recovered after {self.args.settle:g} s")
            try:
                getattr(self, kind)(lasting)
            except Exception as error:  # recorded: the soak fails, the rest still runs
                self.actions_failed.append(f"{kind}: {error!r}")
                print(f"  {kind} failed: {error!r}", flush=True)
        end = began + self.args.duration
        if time.time() < end:
            time.sleep(end - time.time())

    def quiet(self, seconds: float) -> None:
        """The last fault's recovery is measured with the producer still running."""
        if self.faults.entries:
            self.wait(functools.partial(self.recovered, self.faults.entries[-1]), seconds)

    def drained(self) -> bool:
        assert self.producer is not None
        sink = self.sink_ids()
        if not set(self.producer.acked) <= set(sink):
            return False
        alerts = {order for order, _ in self.alert_copies()}
        return self.producer.large_orders <= alerts

    def drain(self) -> float | None:
        began = time.time()
        if self.wait(self.drained, self.args.drain):
            return round(time.time() - began, 1)
        return None

    def stop_driver(self) -> None:
        with self._driver_lock:
            self.killing = True
            (self.work / "stop").touch()
            driver = self.driver
            if driver is not None:
                try:
                    driver.wait(120)
                    self._driver_ended("stopped")
                except subprocess.TimeoutExpired:
                    self.kill_driver_group()
                    self._driver_ended("killed at the end")

    # --- reading what was written -------------------------------------------------------------

    def sink_ids(self) -> Counter[str]:
        from support.parquet_log import committed_column

        try:
            return Counter(str(v) for v in committed_column(self.out, "event_id"))
        except (OSError, ValueError):
            return Counter()  # a file being committed right now: read again next time

    def alert_copies(self) -> list[tuple[str, float]]:
        """(order id, arrival time) of every alert in the alerts stream, aggregates unpacked."""
        from shardflow.aggregation import deaggregate
        from shardflow.records import Record

        kinesis = self.client("kinesis", self.kinesis_url)
        copies = []
        for shard in kinesis.list_shards(StreamName=self.alerts)["Shards"]:
            iterator = kinesis.get_shard_iterator(
                StreamName=self.alerts, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            for _ in range(10_000):
                page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
                for raw in page["Records"]:
                    arrived = raw["ApproximateArrivalTimestamp"].timestamp()
                    record = Record(
                        data=raw["Data"],
                        partition_key=raw["PartitionKey"],
                        sequence_number=raw["SequenceNumber"],
                        shard_id=shard["ShardId"],
                    )
                    for user in deaggregate(record):
                        copies.append((str(json.loads(user.data)["order_id"]), arrived))
                iterator = page.get("NextShardIterator")
                if not page["Records"] or not iterator:
                    break
        return copies

    def ready_times(self) -> None:
        """Each driver's ``DRIVER STARTED pid time`` line: when its queries were started."""
        ready: dict[int, float] = {}
        log = self.dir / "driver.log"
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if line.startswith("DRIVER STARTED "):
                pid, moment = line.split()[2:4]
                ready[int(pid)] = float(moment)
        self.drivers = [dataclasses.replace(d, ready=ready.get(d.pid)) for d in self.drivers]

    def result(self, drained_after: float | None, stopped: float) -> dict[str, Any]:
        assert self.producer is not None
        self.ready_times()
        self.kinesis_proxy.wait_idle(30)
        self.s3_proxy.wait_idle(30)
        batches = self.batches()
        tasks = read_tasks(self.work / "eventlog", self.drivers)
        report = check.check(
            acked=self.producer.acked,
            sent=self.producer.sent,
            sink=self.sink_ids(),
            expected_alerts=self.producer.large_orders,
            alert_copies=self.alert_copies(),
            faults=self.faults.entries,
            batches=batches,
            tasks=tasks,
            drivers=self.drivers,
            batch_bound=self.args.batch_bound,
            until=stopped,
            running_since=self.running_since,
        )
        if self.actions_failed:
            report.failures.append(f"{len(self.actions_failed)} faults could not be injected")
        for query in self.QUERIES:
            ids = sorted(b.batch_id for b in batches if b.query == query)
            if ids != list(range(len(ids))):
                # A checkpoint that lost batch files would hide what the faults hit.
                report.failures.append(f"{query}: micro-batches missing from the checkpoint")
        if self.driver_failures:
            # A brownout or a lost executor must delay batches, not fail the query.
            report.failures.append(
                f"the driver exited on its own {len(self.driver_failures)} times"
            )
        if drained_after is None:
            report.failures.append(f"not drained within {self.args.drain:g} s")
        if self.producer.error is not None:
            report.failures.append(f"the producer failed: {self.producer.error!r}")
        kinds = Counter(f.kind for f in self.faults.entries)
        requests = {
            "kinesis_forwarded": sum(
                self.kinesis_proxy.forwarded(op)
                for op in ("GetRecords", "PutRecords", "ListShards", "GetShardIterator")
            ),
            "kinesis_failed": len(self.kinesis_proxy.injections),
            "s3_failed": len(self.s3_proxy.injections),
        }
        return {
            "began": self.began,
            "faults": dict(sorted(kinds.items())),
            "timeline": [
                {**_asdict(f), "at": round(f.start - self.began, 2)} for f in self.faults.entries
            ],
            "drivers": [
                {
                    "pid": d.pid,
                    "started": round(d.started - self.began, 2),
                    "ready": None if d.ready is None else round(d.ready - self.began, 2),
                    "ended": None if d.ended is None else round(d.ended - self.began, 2),
                    "how": d.how,
                }
                for d in self.drivers
            ],
            "driver_failures": self.driver_failures,
            "actions_failed": self.actions_failed,
            "events_sent": len(self.producer.sent),
            "events_failed": len(self.producer.failed),
            "large_orders": len(self.producer.large_orders),
            "tasks": len(tasks),
            "tasks_failed": sum(1 for t in tasks if t.reason not in (None, "Success")),
            "proxy": requests,
            "drained_after": drained_after,
            "run_dir": str(self.dir),
            "passed": report.passed,
            "report": report.as_dict(),
        }


def source_commit() -> str:
    """The commit of the code this run measured ("+" if src, bench or the demo had changes)."""
    from chaos import source_commit as commit  # bench/ is this script's first import path

    return commit(("src", "bench", "examples"))


# --- tables -----------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(result: dict[str, Any]) -> str:
    """Per fault: what it failed or hit, and how long until every query committed again."""
    report = result["report"]
    began = result["began"]
    lines = [
        "| at (s) | fault | lasted (s) | requests failed | micro-batches in flight | "
        "tasks failed / lost with the driver | recovered after (s) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in report["per_fault"]:
        failed = "-" if p["requests_failed"] is None else f"{p['requests_failed']:,}"
        target = f" {p['target']}" if p["target"] else ""
        lines.append(
            f"| {p['start'] - began:.0f} | {p['kind']}{target} | {p['end'] - p['start']:.1f} "
            f"| {failed} | {p['batches_in_flight']} | {p['tasks_failed']} / "
            f"{p['tasks_lost_with_driver']} | {_seconds(p['recovery'])} |"
        )
    causes = ", ".join(f"{k} {v}" for k, v in report["alert_duplicates_by_cause"].items())
    lines += [
        "",
        f"Events: {report['events_acked']:,} acknowledged, {report['lost']} lost, "
        f"{report['duplicated']} twice in the file sink, {report['unexpected']} never sent. "
        f"Alerts: {report['alerts_expected']:,} large orders, {report['alerts_missing']} missing, "
        f"{report['alert_duplicates']} extra copies ({causes or 'none'}). Micro-batches: "
        f"{sum(report['batches'].values()):,}, longest {report['longest_batch']:.1f} s of driver "
        f"time (bound {report['batch_bound']:g} s), {len(report['stuck'])} past it. Driver "
        f"restarts after a failed query: {len(result['driver_failures'])}. "
        f"({result['duration'] / 60:.0f} min, {result['rate']:g} events/s, {result['shards']} "
        f"shards split and merged, {result['workers']} workers x 1 core; {result['machine']}; "
        f"commit {result['commit']}; {'passed' if result['passed'] else 'FAILED'})",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--short", action="store_true", help="120 s, every fault class once")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="events/s produced")
    parser.add_argument("--batch-bound", type=float, default=BATCH_BOUND)
    parser.add_argument(
        "--aim", type=float, default=10.0, help="seconds a kill may wait for a batch in flight"
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=120.0,
        help="seconds a fault may wait for every query to commit after the previous one",
    )
    parser.add_argument("--start-timeout", type=float, default=240.0)
    parser.add_argument(
        "--quiet", type=float, default=60.0, help="seconds to see the last recovery"
    )
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to catch up")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--skip", action="append", default=[], help="leave out a fault class")
    parser.add_argument("--results", help="JSON path (default bench/results/chaos_spark.json)")
    parser.add_argument("--keep", help="directory for the run's files (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.short:
        args.duration = min(args.duration, 120.0)
    return args


def main() -> None:
    args = parse_args()
    fleet_kit.stop_on_sigterm()  # unwind: the finally blocks stop every process it started
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "chaos"),
        ("AWS_SECRET_ACCESS_KEY", "chaos"),
        ("AWS_DEFAULT_REGION", REGION),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        os.environ.setdefault(name, value)
    commit = source_commit()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="chaos-spark-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"Spark chaos soak: {args.duration:.0f} s of faults, {args.rate:g} events/s", flush=True)
    from shardflow.local import KinesisLocalServer, MotoServer

    began = time.monotonic()
    with KinesisLocalServer(shard_limit=100) as kinesis, MotoServer() as moto:
        run = Soak(args, root, kinesis.endpoint_url, moto.endpoint_url).run()
    result: dict[str, Any] = {
        "benchmark": "chaos_spark",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "duration": args.duration,
        "short": args.duration < 300,
        "rate": args.rate,
        "shards": SHARDS,
        "workers": 2,
        "seed": args.seed,
        "faults_left_out": sorted(args.skip),
        **run,
        "took": round(time.monotonic() - began, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "commit": commit,
    }
    text = render(result)
    print("\n" + text)
    report = result["report"]
    print(f"\nfiles: {result['run_dir']}; passed: {result['passed']} {report['failures']}")
    for name, examples in report["examples"].items():
        for example in examples:
            print(f"  {name}: {example}")
    for line in report["stuck"] + report["silent_faults"] + report["uninterrupting"]:
        print(f"  {line}")
    for line in report["stalled"] + result["actions_failed"] + result["driver_failures"]:
        print(f"  {line}")
    path = Path(args.results) if args.results else RESULTS / "chaos_spark.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
