"""What the fleet benches share (bench/handoff.py, bench/fleet.py): a worker child process, a
producer thread, reading what the workers handled, and a percentile.

bench/ is a folder of scripts, not a package: they run as ``python bench/NAME.py``, so bench/
is on ``sys.path`` and ``import fleet_kit`` finds this file.

- :func:`run_worker` is the body of a worker child process: shardflow's ``Consumer.run``
  (SIGTERM stops it gracefully), one unbuffered line ``worker, shard, record id, time`` per
  record handled (so a kill -9 loses no line of what was handled); optionally it counts its
  AWS requests per operation (botocore ``before-call`` / ``after-call`` hooks on the clients'
  session) and writes the running totals to a file once a second.
- :class:`Producer` writes ``rate`` records/s to every shard with explicit hash keys, each
  record carrying a unique id and its send time, and remembers every id it wrote.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def stop_on_sigterm() -> None:
    """A bench parent stopped with SIGTERM (``kill PID``, a CI timeout) unwinds as on Ctrl-C:
    its ``finally`` blocks stop the workers, the producer and the emulators it started.
    Python's default for SIGTERM ends the process at once and leaves them running."""

    def unwind(signum: int, _frame: object) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


REGION = "us-east-1"
TICK = 0.1  # the producer sends a batch per shard this often
FAILOVER = 6.0
IDLE_TIME = 0.2
PICKUP_INTERVAL = 0.2
TAKE_EVERY = (FAILOVER + 0.025) * 2
HANDOFF_TIMEOUT = 10.0
SUCCESSOR_WAIT = 10.0
DRAIN_TIMEOUT = 5.0

LATENCY_EDGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
"""Upper edges (seconds) of the request latency buckets a counting worker keeps; one more
bucket holds everything slower."""


# --- the worker process -------------------------------------------------------------------------


class RequestCounter:
    """AWS requests of one process per ``service.Operation``: calls, failed calls (an HTTP
    status >= 300 or no answer), latency buckets (:data:`LATENCY_EDGES`). Fed by botocore's
    ``before-call`` / ``after-call`` / ``after-call-error`` events, one dict update each."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.buckets: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def register(self, session: Any) -> None:
        session.register("before-call", self._before)
        session.register("after-call", self._after)
        session.register("after-call-error", self._error)

    @staticmethod
    def _key(event_name: str) -> str:
        _, service, operation = event_name.split(".", 2)
        return f"{service}.{operation}"

    def _before(self, context: dict[str, Any], **_: Any) -> None:
        context["bench_sent"] = time.monotonic()

    def _after(
        self, event_name: str, context: dict[str, Any], http_response: Any, **_: Any
    ) -> None:
        self._count(event_name, context, failed=http_response.status_code >= 300)

    def _error(self, event_name: str, context: dict[str, Any], **_: Any) -> None:
        self._count(event_name, context, failed=True)

    def _count(self, event_name: str, context: dict[str, Any], *, failed: bool) -> None:
        sent = context.get("bench_sent")
        took = time.monotonic() - sent if sent is not None else 0.0
        key = self._key(event_name)
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            if failed:
                self.failed[key] = self.failed.get(key, 0) + 1
            buckets = self.buckets.setdefault(key, [0] * (len(LATENCY_EDGES) + 1))
            buckets[bisect.bisect_left(LATENCY_EDGES, took)] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "t": time.time(),
                "calls": dict(self.calls),
                "failed": dict(self.failed),
                "buckets": {key: list(value) for key, value in self.buckets.items()},
            }


def stack_env(kinesis: str, dynamodb: str) -> dict[str, str]:
    """This process's environment with AWS calls pointed at the bench's emulators (for the
    worker processes it starts; the lease table's stream, where there is one, is on
    ``dynamodb`` too)."""
    env = dict(os.environ)
    env.update(
        {
            "AWS_ENDPOINT_URL_KINESIS": kinesis,
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": dynamodb,
            "AWS_DEFAULT_REGION": REGION,
        }
    )
    return env


def stack_clients(kinesis: str, dynamodb: str) -> tuple[Any, Any]:
    """boto3 DynamoDB and Kinesis clients of the bench's emulators, for the bench itself."""
    import boto3

    return (
        boto3.client("dynamodb", endpoint_url=dynamodb, region_name=REGION),
        boto3.client("kinesis", endpoint_url=kinesis, region_name=REGION),
    )


def lease_settings(*, handoff: bool, lease_server: str) -> Any:
    """The benches' lease timings (short, so that a run takes minutes; KCL's ratios)."""
    from shardflow.leases.settings import LeaseSettings

    return LeaseSettings(
        failover_time=FAILOVER,
        handoff=handoff,
        # dynalite has no DynamoDB Streams: pick-up polls the table there.
        pickup=("stream" if lease_server == "moto" else "poll") if handoff else "off",
        pickup_poll_interval=PICKUP_INTERVAL,
        handoff_timeout=HANDOFF_TIMEOUT,
        # A deploy that stops the old workers as the new ones start (handoff.py's scenario d):
        # keep the shards going until a new worker shows rather than release them.
        successor_wait=SUCCESSOR_WAIT if handoff else 0.0,
        **_overrides(),
    )


def _overrides() -> dict[str, Any]:
    """Lease settings a diagnostic run changes through the environment (inherited by the
    workers): ``SHARDFLOW_BENCH_LEASES='{"renew_concurrency": 4}'``."""
    raw = os.environ.get("SHARDFLOW_BENCH_LEASES")
    return json.loads(raw) if raw else {}


def run_worker(
    *,
    worker_id: str,
    stream: str,
    application: str,
    out: str,
    handoff: bool,
    lease_server: str,
    counts: str | None = None,
) -> None:
    """A worker child process: handles records until SIGTERM (graceful stop), then returns."""
    import logging

    # Lease moves with timestamps, in the worker's log file, for reading a run afterwards.
    logging.basicConfig(level=logging.WARNING, format="%(created).3f %(name)s %(message)s")
    logging.getLogger("shardflow").setLevel(logging.INFO)
    from shardflow.aws.clients import ClientFactory
    from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
    from shardflow.fetch import Polling

    settings = ConsumerSettings(
        worker_id=worker_id,
        leases=lease_settings(handoff=handoff, lease_server=lease_server),
        fetch=Polling(idle_time=IDLE_TIME),
        drain_timeout=DRAIN_TIMEOUT,
    )
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    probe = LoopProbe()

    def handle(record: ConsumedRecord[bytes]) -> None:
        if probe.loop is None:
            try:
                loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:  # a sync handler run in a thread: the consumer's loop
                loop = getattr(consumer, "_loop", None)
            if loop is not None:
                probe.watch(loop)
        record_id = record.data.split(b"|", 1)[0].decode()
        os.write(fd, f"{worker_id}\t{record.shard_id}\t{record_id}\t{time.time():.6f}\n".encode())

    clients = None
    writer = None
    if counts is not None:
        counter = RequestCounter()
        clients = ClientFactory()
        counter.register(clients.session)
        writer = CountsWriter(counter, Path(counts))
        writer.start()
    consumer = Consumer(stream, application, settings=settings, clients=clients)
    try:
        consumer.run(handle)  # SIGTERM: graceful stop (handoff or release), then return
    finally:
        probe.stop()
        if writer is not None:
            writer.stop()
    os.close(fd)


LOOP_LATE = 0.25
"""Seconds a worker's event loop may be late for a callback before the probe logs it."""


class LoopProbe(threading.Thread):
    """How late the worker's event loop runs a callback scheduled from another thread, every
    0.1 s; a lateness over :data:`LOOP_LATE` is logged (``loop late by X s``) with the time
    the callback was scheduled, so that a pause of shards that did not move can be told apart
    from a stalled worker (its own loop busy, or the process starved of CPU) and from the
    producer. One callback in flight at a time: a loop blocked for 2 s logs one line."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._halt = threading.Event()
        self._answered = threading.Event()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.start()

    def run(self) -> None:
        import logging

        log = logging.getLogger("bench.loop")
        loop = self.loop
        assert loop is not None
        while not self._halt.wait(0.1):
            self._answered.clear()
            asked_wall, asked = time.time(), time.monotonic()
            try:
                loop.call_soon_threadsafe(self._answered.set)
            except RuntimeError:  # the loop closed: the worker is ending
                return
            while not self._answered.wait(1.0):
                if self._halt.is_set() or loop.is_closed():
                    return
            late = time.monotonic() - asked
            if late > LOOP_LATE:
                log.warning("loop late by %.3f s (asked at %.3f)", late, asked_wall)

    def stop(self) -> None:
        self._halt.set()


class CountsWriter(threading.Thread):
    """Replaces ``path`` with the counter's running totals once a second (and at the end)."""

    def __init__(self, counter: RequestCounter, path: Path) -> None:
        super().__init__(daemon=True)
        self.counter = counter
        self.path = path
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            self.write()

    def write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.counter.snapshot()))
        temporary.replace(self.path)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.write()


def read_counts(path: Path) -> dict[str, Any] | None:
    """The last totals a counting worker wrote (None before its first write)."""
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return loaded


# --- the producer -------------------------------------------------------------------------------


class Producer(threading.Thread):
    """Writes ``rate`` records/s to every shard until stopped; remembers every id."""

    def __init__(self, endpoint: str, stream: str, hash_keys: dict[str, str], rate: float) -> None:
        super().__init__(daemon=True)
        import boto3

        self.kinesis = boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)
        self.stream = stream
        self.hash_keys = hash_keys
        self.rate = rate
        self.written: dict[str, tuple[str, float]] = {}  # id -> (shard, send time)
        self.failures = 0
        self.put_seconds: list[float] = []  # how long each PutRecords call took
        self.put_log: list[tuple[float, float]] = []  # (wall time sent, seconds) per call
        self._halt = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._next = 0

    def run(self) -> None:
        owed = 0.0  # records per shard due but not yet sent (fractional rates add up)
        next_at = time.monotonic()
        while not self._halt.is_set():
            if not self._running.is_set():
                self._running.wait(0.5)
                next_at = time.monotonic()
                continue
            entries = []
            sent = time.time()
            owed += self.rate * TICK
            per_tick, owed = int(owed), owed - int(owed)
            for shard_id, hash_key in self.hash_keys.items():
                for _ in range(per_tick):
                    record_id = f"{self._next:09d}"
                    self._next += 1
                    entries.append((record_id, shard_id, hash_key))
            for start in range(0, len(entries), 500):  # PutRecords takes 500 at most
                self._put(entries[start : start + 500], sent)
            next_at += TICK
            self._halt.wait(max(0.0, next_at - time.monotonic()))

    def _put(self, entries: list[tuple[str, str, str]], sent: float) -> None:
        pending = entries
        for _ in range(10):
            began, began_wall = time.monotonic(), time.time()
            answer = self.kinesis.put_records(
                StreamName=self.stream,
                Records=[
                    {
                        "Data": f"{rid}|{sent:.6f}".encode(),
                        "PartitionKey": rid,
                        "ExplicitHashKey": key,
                    }
                    for rid, _, key in pending
                ],
            )
            self.put_seconds.append(time.monotonic() - began)
            self.put_log.append((began_wall, self.put_seconds[-1]))
            retry = []
            for entry, result in zip(pending, answer["Records"], strict=True):
                if "SequenceNumber" in result:
                    self.written[entry[0]] = (result["ShardId"], sent)
                else:
                    retry.append(entry)
            if not retry:
                return
            self.failures += len(retry)
            pending = retry
            time.sleep(0.05)

    def pause(self) -> None:
        """Write nothing until :meth:`resume` (the batch being sent is finished)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._halt.set()
        self._running.set()
        self.join(10)


# --- reading a run ------------------------------------------------------------------------------

Handled = tuple[str, str, str, float]
"""One record handled: worker, shard, record id, wall time."""


def read_handled(paths: Iterable[Path]) -> list[Handled]:
    """Every line the workers wrote to ``paths`` (files not yet created are skipped)."""
    rows = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                rows.append((parts[0], parts[1], parts[2], float(parts[3])))
    return rows


def wait_for(condition: Callable[[], bool], within: float, every: float = 0.1) -> bool:
    """Whether ``condition()`` came true within ``within`` seconds (checked every ``every``)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return False


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank) of a non-empty list."""
    return percentile(values, 0.99)


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` percentile (nearest rank, 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
