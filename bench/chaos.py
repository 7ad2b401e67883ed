"""Chaos soak: a live producer, 4 worker processes and a schedule of faults; nothing may be lost.

Kinesis runs on kinesis-local (it ends split and merged shards as Kinesis does), the lease table
and the idempotency table on moto's DynamoDB; every process reaches them through a fault proxy
(``shardflow.testing.FaultProxy``) that this script drives. A producer process writes ``key|seq``
records (64 keys, per-key ranks, KPL aggregation, key order preserved) into a 16-shard stream,
plus every so often a record the handler refuses, one the deserializer rejects and a
malformed KPL aggregate (all must end in the dead letters). Four worker processes run a
``Consumer`` with the dispatcher in key mode, the DynamoDB idempotency guard,
``on_failure="skip"`` and dead letters in a file; their handler logs each call's start and end
(``chaos_roles.py``). The schedule, by default over
10 minutes (``--short``: 2 minutes, the same fault classes compressed):

- Kinesis brownouts (HTTP 500 on 90 % of calls for 10-30 s) and throttling bursts
  (GetRecords throttled, PutRecords entries failed);
- DynamoDB brownouts (HTTP 500 on 90 % of calls), one longer than the failover time;
- kill -9 of a worker (restarted 3 s later), SIGTERM rolling restarts of all workers,
  SIGSTOP of a worker for longer than the failover time, then SIGCONT;
- a shard split and a merge of two neighbours.

Then the faults stop, the producer stops, the workers get ``--drain`` seconds to catch up, and
``chaos_check.py`` reads the logs: records lost, per-key order violations, moments two workers
ran handlers for one shard at once, duplicates (each attributed to a fault), stuck shards.

    .venv/bin/python bench/chaos.py                 # 10 minutes; bench/results/chaos.json
    .venv/bin/python bench/chaos.py --short --results /tmp/chaos.json --keep /tmp/run

Only processes this script started are signalled, by PID; all of them are gone when it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import contextlib

import chaos_check
import chaos_roles
import fleet_kit

HERE = Path(__file__).parent
RESULTS = HERE / "results"
REGION = "us-east-1"
SHARDS = 16
WORKERS = 4
KEYS = 64
FAILOVER = 6.0
DEFAULT_RATE = 500.0
"""Records/s without the guard: 16 shards at ~31 records/s each, which the local stack (two
cores shared by kinesis-local, moto, the proxies, a producer and four workers) sustains."""
DEFAULT_GUARD_RATE = 30.0
"""Records/s with the guard: its two DynamoDB writes per record kept up at 30 on moto behind
the proxy's 5-10 ms latency, not at 40 (see docs/benchmarks.md)."""
DEFAULT_BATCH_RATE = 200.0
"""Records/s with the guard batching claims (TransactWriteItems) and completions."""

# (at second, action, seconds it lasts) for a 600 s run; the short schedule for 120 s. Runs of
# other lengths scale the times (not the durations) of the nearer schedule.
LONG_SCHEDULE: list[tuple[float, str, float]] = [
    (20, "throttle", 15),
    (45, "kill", 0),
    (75, "kinesis_brownout", 20),
    (110, "stop", FAILOVER + 4),
    (140, "split", 0),
    (160, "dynamodb_brownout", 12),
    (190, "rolling", 0),
    (250, "throttle", 10),
    (270, "kill", 0),
    (300, "merge", 0),
    (330, "kinesis_brownout", 30),
    (380, "stop", FAILOVER + 6),
    (410, "dynamodb_brownout", FAILOVER * 3),
    (450, "kill", 0),
    (452, "kill", 0),
    (480, "split", 0),
    (500, "rolling", 0),
    (540, "both_brownouts", 10),
]
SHORT_SCHEDULE: list[tuple[float, str, float]] = [
    (8, "throttle", 6),
    (15, "kill", 0),
    (25, "kinesis_brownout", 10),
    (40, "stop", FAILOVER + 3),
    (52, "split", 0),
    (60, "dynamodb_brownout", 8),
    (72, "rolling", 0),
    (95, "merge", 0),
    (100, "kill", 0),
]


def schedule_for(duration: float, skip: frozenset[str]) -> list[tuple[float, str, float]]:
    base, length = (SHORT_SCHEDULE, 120.0) if duration < 300 else (LONG_SCHEDULE, 600.0)
    out = []
    for at, action, lasting in base:
        if action == "both_brownouts":
            # Either half may be left out (--skip): the other then runs alone.
            left = [b for b in ("kinesis_brownout", "dynamodb_brownout") if b not in skip]
            action = action if len(left) == 2 else left[0] if left else ""
        if action and action not in skip:
            out.append((at * duration / length, action, lasting))
    return out


# --- processes ------------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One worker process: ``w2.1`` is the second start of worker slot 2."""

    name: str
    process: subprocess.Popen[bytes]
    frozen: bool = False
    signals_ready: bool = False
    """Its log says it handles SIGTERM (``Ready``): before that a SIGTERM kills it with -15."""

    def ready(self, run_dir: Path) -> bool:
        """Whether the worker has installed its stop signals (read once from its log's head,
        where the line is: it comes before any lease is taken)."""
        if not self.signals_ready:
            try:
                with (run_dir / f"{self.name}.tsv").open("rb") as log:
                    self.signals_ready = b"\tReady\t" in log.read(16384)
            except OSError:
                pass
        return self.signals_ready


@dataclass
class Fleet:
    """The worker processes, by slot; every PID this script started is remembered."""

    run_dir: Path
    command: Callable[[str], list[str]]
    env: dict[str, str]
    slots: dict[int, Incarnation] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    every: list[subprocess.Popen[bytes]] = field(default_factory=list)
    history: list[Incarnation] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    claimed: set[str] = field(default_factory=set)
    """Incarnations a kill or a SIGSTOP has chosen and not let go of. Faults run in threads
    and may aim at once (the long schedule's two kills 2 s apart): without a claim both can
    pick the same process, the second kill then hits nothing, and each starts a replacement,
    two workers in one slot, one of which nobody stops."""

    def start(self, slot: int) -> Incarnation:
        with self.lock:
            n = self.starts.get(slot, 0)
            self.starts[slot] = n + 1
            name = f"w{slot}.{n}"
            log = (self.run_dir / f"{name}.log").open("wb")
            process = subprocess.Popen(
                self.command(name), env=self.env, stdout=log, stderr=log, cwd=self.run_dir
            )
            log.close()
            self.every.append(process)
            self.slots[slot] = Incarnation(name, process)
            self.history.append(self.slots[slot])
            return self.slots[slot]

    def running(self) -> list[tuple[int, Incarnation]]:
        """The workers running and not frozen, ready or still starting."""
        with self.lock:
            return [
                (slot, inc)
                for slot, inc in sorted(self.slots.items())
                if inc.process.poll() is None and not inc.frozen
            ]

    def live(self) -> list[tuple[int, Incarnation]]:
        """The running, unfrozen workers that are ready for a fault (see ``wait_ready``)."""
        return [(slot, inc) for slot, inc in self.running() if inc.ready(self.run_dir)]

    def wait_ready(self, inc: Incarnation, timeout: float = 60.0) -> bool:
        """Wait until ``inc`` handles SIGTERM (a loaded machine took 7 s to start a worker, and
        a rolling restart's SIGTERM before that ended it with -15, a worker 'failed')."""
        deadline = time.monotonic() + timeout
        while not inc.ready(self.run_dir):
            if inc.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def current(self, slot: int) -> Incarnation | None:
        """The slot's process now, if it runs and is not frozen; None while a kill's
        replacement is still to come."""
        with self.lock:
            inc = self.slots.get(slot)
        if inc is None or inc.process.poll() is not None or inc.frozen:
            return None
        return inc

    def claim(self, inc: Incarnation) -> bool:
        """Take ``inc`` for one fault; False if another fault holds it or it is gone."""
        with self.lock:
            if inc.name in self.claimed or inc.process.poll() is not None:
                return False
            self.claimed.add(inc.name)
            return True

    def replace(self, slot: int, gone: Incarnation) -> Incarnation | None:
        """Start ``slot``'s next process if ``gone`` still holds it (None if something else,
        a rolling restart, has replaced it meanwhile)."""
        with self.lock:
            if self.slots.get(slot) is not gone:
                return None
        return self.start(slot)

    def let_go(self, inc: Incarnation) -> None:
        """``inc`` may be chosen again (a SIGSTOP's victim once it runs again)."""
        with self.lock:
            self.claimed.discard(inc.name)

    def kill_all(self) -> None:
        """SIGCONT and SIGKILL every process still running (by its PID)."""
        for process in self.every:
            if process.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, sig)
                process.wait(10)


class FaultLog:
    """``faults.tsv``: kind, target, start, end (wall clock), the PID signalled and the
    requests the proxy failed (empty when not applicable), one line per fault."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[tuple[str, str, float, float]] = []

    def add(
        self,
        kind: str,
        target: str,
        start: float,
        end: float,
        *,
        pid: int | None = None,
        injected: int | None = None,
    ) -> None:
        pid_text = "" if pid is None else str(pid)
        injected_text = "" if injected is None else str(injected)
        with self._lock:
            self.entries.append((kind, target, start, end))
            with self.path.open("a") as file:
                file.write(
                    f"{kind}\t{target}\t{start:.6f}\t{end:.6f}\t{pid_text}\t{injected_text}\n"
                )
        extra = f", pid {pid}" if pid is not None else ""
        extra += f", {injected} requests failed" if injected is not None else ""
        print(
            f"  {time.strftime('%H:%M:%S')} {kind} {target} ({end - start:.1f} s{extra})",
            flush=True,
        )


# --- the soak -------------------------------------------------------------------------------


class Soak:
    """One mode of the soak (with or without the idempotency guard) on its own servers."""

    def __init__(
        self,
        args: argparse.Namespace,
        kinesis_url: str,
        moto_url: str,
        *,
        guard: bool,
        batch: bool,
        rate: float,
        run_dir: Path,
    ) -> None:
        from shardflow.testing.faults import FaultProxy

        self.args = args
        self.rng = random.Random(args.seed)
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.stream = f"chaos-{stamp}"
        self.app = f"chaos-app-{stamp}"
        self.guard_table = f"chaos-guard-{stamp}" if guard else ""
        self.guard = guard
        self.batch = batch
        self.rate = rate
        self.kinesis_url = kinesis_url
        self.moto_url = moto_url
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.kinesis_proxy = FaultProxy(kinesis_url, seed=args.seed)
        self.dynamodb_proxy = FaultProxy(moto_url, seed=args.seed + 1)
        if args.latency:
            # Every DynamoDB request waits as it would on the real service (a few ms).
            low, high = args.latency
            self.dynamodb_proxy.set_latency(low / 1000, high / 1000, service="DynamoDB")
        self.faults = FaultLog(self.dir / "faults.tsv")
        self.env = dict(os.environ)
        self.env.update(
            {
                "AWS_ACCESS_KEY_ID": "chaos",
                "AWS_SECRET_ACCESS_KEY": "chaos",
                "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true",
            }
        )
        self.producer: subprocess.Popen[bytes] | None = None
        self.fleet: Fleet | None = None
        self.actions: list[threading.Thread] = []
        self.skipped: list[str] = []
        self.signalled: set[str] = set()  # incarnations this script killed or stopped
        self.window = (0.0, 0.0)  # wall-clock start and end of the faults' schedule

    # --- set-up -----------------------------------------------------------------------------

    def kinesis(self) -> Any:
        import boto3

        return boto3.client(
            "kinesis",
            endpoint_url=self.kinesis_url,
            region_name=REGION,
            aws_access_key_id="chaos",
            aws_secret_access_key="chaos",
        )

    def prepare(self) -> None:
        kinesis = self.kinesis()
        kinesis.create_stream(StreamName=self.stream, ShardCount=SHARDS)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            summary = kinesis.describe_stream_summary(StreamName=self.stream)
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            time.sleep(0.2)
        if self.guard_table:
            asyncio.run(self._guard_table())

    async def _guard_table(self) -> None:
        from shardflow.aws import AwsSettings, ClientFactory
        from shardflow.idempotency import DynamoDBIdempotencyGuard

        factory = ClientFactory(AwsSettings(endpoint_url=self.moto_url, region=REGION))
        async with DynamoDBIdempotencyGuard.connect(factory, self.guard_table, create=True):
            pass

    def worker_command(self, name: str) -> list[str]:
        return [
            sys.executable,
            str(HERE / "chaos_roles.py"),
            "worker",
            "--stream",
            self.stream,
            "--app",
            self.app,
            "--kinesis",
            self.kinesis_proxy.url,
            "--dynamodb",
            self.dynamodb_proxy.url,
            "--guard-table",
            self.guard_table,
            "--worker-id",
            name,
            "--out",
            str(self.dir / f"{name}.tsv"),
            "--dead-letters",
            str(self.dir / f"{name}.dlq.jsonl"),
            "--failover",
            str(FAILOVER),
            "--seed",
            str(self.args.seed),
            "--slow-fraction",
            str(self.args.slow_fraction),
            *(["--batch-guard"] if self.batch else []),
        ]

    def start_producer(self) -> None:
        log = (self.dir / "producer.log").open("wb")
        command = [
            sys.executable,
            str(HERE / "chaos_roles.py"),
            "producer",
            "--stream",
            self.stream,
            "--kinesis",
            self.kinesis_proxy.url,
            "--out",
            str(self.dir / "produced.tsv"),
            "--rate",
            str(self.rate),
            "--keys",
            str(KEYS),
            "--poison-every",
            str(self.args.poison_every),
            "--seed",
            str(self.args.seed),
            "--aggregate",
        ]
        self.producer = subprocess.Popen(command, env=self.env, stdout=log, stderr=log)
        log.close()

    # --- faults -----------------------------------------------------------------------------

    def act(self, action: str, lasting: float) -> None:
        handlers: dict[str, Callable[[float], None]] = {
            "throttle": self.throttle,
            "kinesis_brownout": self.kinesis_brownout,
            "dynamodb_brownout": self.dynamodb_brownout,
            "both_brownouts": self.both_brownouts,
            "kill": lambda _: self.kill(),
            "stop": self.stop,
            "rolling": lambda _: self.rolling(),
            "split": lambda _: self.split(),
            "merge": lambda _: self.merge(),
        }
        try:
            handlers[action](lasting)
        except Exception as exc:  # one failed action must not end the soak
            print(f"  action {action} failed: {type(exc).__name__}: {exc}", flush=True)
            self.skipped.append(f"{action}: {type(exc).__name__}: {exc}")

    def throttle(self, lasting: float) -> None:
        from shardflow.testing.faults import THROTTLED, ErrorResponse, PartialFailure

        proxy = self.kinesis_proxy
        rules = [
            proxy.add(ErrorResponse(THROTTLED), operation="GetRecords", probability=0.5),
            proxy.add(PartialFailure(fraction=0.3), probability=0.5),
        ]
        self._hold(rules, proxy, "throttle", lasting)

    def kinesis_brownout(self, lasting: float) -> None:
        from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse

        proxy = self.kinesis_proxy
        rule = proxy.add(ErrorResponse(INTERNAL_FAILURE, status=500), probability=0.9)
        self._hold([rule], proxy, "kinesis_brownout", lasting)

    def dynamodb_brownout(self, lasting: float) -> None:
        from shardflow.testing.faults import ErrorResponse

        proxy = self.dynamodb_proxy
        fault = ErrorResponse("InternalServerError", status=500, message="Internal server error")
        assert self.fleet is not None
        self.aim(self.fleet.live(), claim=False)
        rule = proxy.add(fault, service="DynamoDB", probability=0.9)
        self._hold([rule], proxy, "dynamodb_brownout", lasting)

    def both_brownouts(self, lasting: float) -> None:
        """Kinesis and the lease table brown out together, from one aimed moment. Two actions
        at one time would each wait on their own: the lease-table one aims at a handler call
        in flight, and while Kinesis fails 90 % of reads few calls start, so it waited out
        its --aim and began as Kinesis recovered, with no call in flight (a run that could
        not show what it is for: 'uninterrupting')."""
        from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse

        assert self.fleet is not None
        self.aim(self.fleet.live(), claim=False)
        kinesis, dynamodb = self.kinesis_proxy, self.dynamodb_proxy
        kinesis_rule = kinesis.add(ErrorResponse(INTERNAL_FAILURE, status=500), probability=0.9)
        dynamodb_fault = ErrorResponse(
            "InternalServerError", status=500, message="Internal server error"
        )
        dynamodb_rule = dynamodb.add(dynamodb_fault, service="DynamoDB", probability=0.9)
        began = time.time()
        time.sleep(lasting)
        kinesis.remove(kinesis_rule)
        dynamodb.remove(dynamodb_rule)
        ended = time.time()
        time.sleep(0.5)  # requests the proxies still hold are logged once answered
        for kind, proxy, rule in (
            ("kinesis_brownout", kinesis, kinesis_rule),
            ("dynamodb_brownout", dynamodb, dynamodb_rule),
        ):
            self.faults.add(kind, "", began, ended, injected=proxy.injected_count(rule))

    def _hold(self, rules: list[int], proxy: Any, kind: str, lasting: float) -> None:
        began = time.time()
        time.sleep(lasting)
        for rule in rules:
            proxy.remove(rule)
        ended = time.time()
        # Requests still held by the proxy are logged once answered: wait a moment for them.
        time.sleep(0.5)
        injected = sum(proxy.injected_count(rule) for rule in rules)
        self.faults.add(kind, "", began, ended, injected=injected)

    def time_left_in_call(self, name: str) -> float:
        """How long worker ``name`` will still be inside a handler call, by its log's last
        lines: a call started and not ended, whose planned time (``handler_seconds`` of its
        record) has not run out. 0 when it is between calls."""
        path = self.dir / f"{name}.tsv"
        try:
            with path.open("rb") as file:
                file.seek(max(0, path.stat().st_size - 8192))
                tail = file.read().decode(errors="replace").split("\n")[1:-1]
        except OSError:
            return 0.0
        open_calls: dict[tuple[str, ...], float] = {}
        for line in tail:
            f = line.split("\t")
            if f[0] == "S" and len(f) == 8:
                planned = chaos_roles.handler_seconds(
                    self.args.seed, f[2], f[3], int(f[4]), self.args.slow_fraction
                )
                open_calls[tuple(f[1:5])] = float(f[7]) + planned
            elif f[0] == "E" and len(f) == 9:
                open_calls.pop(tuple(f[1:5]), None)
        return max((end - time.time() for end in open_calls.values()), default=0.0)

    def aim(
        self, victims: list[tuple[int, Incarnation]], *, claim: bool = True
    ) -> tuple[int, Incarnation] | None:
        """Wait (at most --aim seconds) until one of ``victims`` is inside a handler call with
        at least 20 ms of it left, and return it, so that the fault lands in a call; at the
        deadline, a random one of them (None if there are none). With ``claim`` the one
        returned is the caller's alone (``Fleet.claim``) until it lets go."""
        assert self.fleet is not None
        fleet = self.fleet

        def take(chosen: tuple[int, Incarnation]) -> bool:
            return not claim or fleet.claim(chosen[1])

        deadline = time.monotonic() + self.args.aim
        while victims and time.monotonic() < deadline:
            for chosen in self.rng.sample(victims, len(victims)):
                running = chosen[1].process.poll() is None
                if running and self.time_left_in_call(chosen[1].name) >= 0.02 and take(chosen):
                    return chosen
            time.sleep(0.002)
        for chosen in self.rng.sample(victims, len(victims)):
            if take(chosen):
                return chosen
        return None

    def kill(self) -> None:
        assert self.fleet is not None
        chosen = self.aim(self.fleet.live())
        if chosen is None:
            return
        slot, victim = chosen
        at = time.time()
        self.signalled.add(victim.name)
        try:
            os.kill(victim.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return  # it exited meanwhile (a rolling restart): nothing was killed
        victim.process.wait(10)
        self.faults.add("kill", victim.name, at, at, pid=victim.process.pid)
        time.sleep(3.0)
        self.fleet.replace(slot, victim)

    def stop(self, lasting: float) -> None:
        assert self.fleet is not None
        chosen = self.aim(self.fleet.live())
        if chosen is None:
            return
        _, victim = chosen
        victim.frozen = True
        began = time.time()
        try:
            os.kill(victim.process.pid, signal.SIGSTOP)
        except ProcessLookupError:
            victim.frozen = False
            self.fleet.let_go(victim)
            return
        time.sleep(lasting)
        os.kill(victim.process.pid, signal.SIGCONT)
        victim.frozen = False
        self.fleet.let_go(victim)
        self.faults.add("stop", victim.name, began, time.time(), pid=victim.process.pid)

    def rolling(self) -> None:
        assert self.fleet is not None
        for slot in [slot for slot, _ in self.fleet.running()]:
            # Who holds the slot at its turn, not at the restart's start: a kill meanwhile
            # replaced the process (or will, 3 s after it), and SIGTERM to the dead one plus a
            # start here left two workers in one slot, one of them untracked.
            victim = self.fleet.current(slot)
            if victim is None or not self.fleet.claim(victim):
                continue  # a kill holds it (and starts its replacement) or it is gone
            self.fleet.wait_ready(victim)
            began = time.time()
            self.signalled.add(victim.name)
            victim.process.send_signal(signal.SIGTERM)
            try:
                victim.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(victim.process.pid, signal.SIGKILL)
                victim.process.wait(10)
                at = time.time()
                self.faults.add("kill", victim.name, at, at, pid=victim.process.pid)
            self.faults.add("term", victim.name, began, time.time(), pid=victim.process.pid)
            self.fleet.start(slot)
            time.sleep(2.0)

    def open_shards(self) -> list[dict[str, Any]]:
        kinesis = self.kinesis()
        shards = kinesis.list_shards(StreamName=self.stream)["Shards"]
        return sorted(
            (s for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
            key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]),
        )

    def split(self) -> None:
        shard = self.rng.choice(self.open_shards())
        low = int(shard["HashKeyRange"]["StartingHashKey"])
        high = int(shard["HashKeyRange"]["EndingHashKey"])
        at = time.time()
        self.kinesis().split_shard(
            StreamName=self.stream,
            ShardToSplit=shard["ShardId"],
            NewStartingHashKey=str((low + high) // 2 + 1),
        )
        self.faults.add("split", shard["ShardId"], at, at)

    def merge(self) -> None:
        shards = self.open_shards()
        i = self.rng.randrange(len(shards) - 1)
        at = time.time()
        self.kinesis().merge_shards(
            StreamName=self.stream,
            ShardToMerge=shards[i]["ShardId"],
            AdjacentShardToMerge=shards[i + 1]["ShardId"],
        )
        self.faults.add("merge", f"{shards[i]['ShardId']}+{shards[i + 1]['ShardId']}", at, at)

    # --- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        self.kinesis_proxy.start()
        self.dynamodb_proxy.start()
        try:
            self.prepare()
            self.fleet = Fleet(self.dir, self.worker_command, self.env)
            self.start_producer()
            for slot in range(1, WORKERS + 1):
                self.fleet.start(slot)
            self.play(schedule_for(self.args.duration, frozenset(self.args.skip)))
            self.quiet_down()
            drained = self.drain()
            self.stop_workers()
            report = self.check()
        finally:
            if self.fleet is not None:
                self.fleet.kill_all()
            if self.producer is not None and self.producer.poll() is None:
                self.producer.kill()
                self.producer.wait(10)
            self.kinesis_proxy.stop()
            self.dynamodb_proxy.stop()
        return self.result(report, drained, time.monotonic() - began)

    def play(self, schedule: list[tuple[float, str, float]]) -> None:
        """Start each action at its time (in its own thread: actions may overlap)."""
        start = time.monotonic()
        self.window = (time.time(), time.time() + self.args.duration)
        queue = [(at, i, action, lasting) for i, (at, action, lasting) in enumerate(schedule)]
        heapq.heapify(queue)
        while time.monotonic() - start < self.args.duration:
            while queue and queue[0][0] <= time.monotonic() - start:
                _, _, action, lasting = heapq.heappop(queue)
                thread = threading.Thread(target=self.act, args=(action, lasting), daemon=True)
                thread.start()
                self.actions.append(thread)
            self._check_producer()
            time.sleep(0.1)

    def _check_producer(self) -> None:
        if self.producer is not None and self.producer.poll() is not None:
            raise RuntimeError(
                f"the producer exited with {self.producer.returncode}; see {self.dir}/producer.log"
            )
        assert self.fleet is not None
        with self.fleet.lock:
            running = [i for i in self.fleet.slots.values() if i.process.poll() is None]
            crashed = [
                i.name
                for i in self.fleet.slots.values()
                if i.process.poll() is not None and i.name not in self.signalled
            ]
        if crashed and not running:
            raise RuntimeError(f"every worker exited on its own ({crashed}); see {self.dir}")

    def quiet_down(self) -> None:
        for thread in self.actions:
            thread.join(120)
        self.kinesis_proxy.clear()
        self.dynamodb_proxy.clear()
        assert self.producer is not None
        self.producer.send_signal(signal.SIGTERM)
        try:
            self.producer.wait(120)
        except subprocess.TimeoutExpired:
            self.producer.kill()
            self.producer.wait(10)

    def drain(self) -> float | None:
        """Seconds until every acknowledged record was handled (None: not within --drain)."""
        began = time.monotonic()
        while time.monotonic() - began < self.args.drain:
            if not self.outstanding():
                return time.monotonic() - began
            time.sleep(2.0)
        return None

    def outstanding(self) -> int:
        acked, poison, _ = chaos_check.read_produced(self.dir / "produced.tsv")
        calls = chaos_check.read_calls(self.dir.glob("w*.tsv"))
        done = {(c.key, c.seq) for c in calls if c.outcome == "ok"}
        letters = chaos_check.read_dead_letter_keys(self.dir.glob("w*.dlq.jsonl"))
        missing = sum(1 for a in acked if (a.key, str(a.seq)) not in done)
        return missing + sum(1 for key, _, _ in poison if not letters[key])

    def stop_workers(self) -> None:
        assert self.fleet is not None
        live = self.fleet.running()
        for _, inc in live:
            self.fleet.wait_ready(inc)
            inc.process.send_signal(signal.SIGTERM)
        for _, inc in live:
            try:
                inc.process.wait(30)
            except subprocess.TimeoutExpired:
                print(f"  {inc.name} did not stop within 30 s of SIGTERM", flush=True)

    def check(self) -> chaos_check.Report:
        acked, poison, gave_up = chaos_check.read_produced(self.dir / "produced.tsv")
        return chaos_check.check(
            acked,
            poison,
            gave_up,
            chaos_check.read_calls(self.dir.glob("w*.tsv")),
            chaos_check.read_dead_letter_keys(self.dir.glob("w*.dlq.jsonl")),
            chaos_check.read_faults(self.dir / "faults.tsv"),
            lease_events=chaos_check.read_lease_events(self.dir.glob("w*.tsv")),
            sent=chaos_check.read_sent(self.dir / "produced.tsv"),
            failover=FAILOVER,
            guarded=self.guard,
        )

    def throughput(self) -> dict[str, Any]:
        """Records first handled during the faults' schedule, per second and per shard."""
        calls = chaos_check.read_calls(self.dir.glob("w*.tsv"))
        first: dict[tuple[str, str], float] = {}
        for c in calls:
            if c.outcome == "ok" and c.end is not None and c.seq.isdigit():
                first[(c.key, c.seq)] = min(first.get((c.key, c.seq), c.end), c.end)
        began, ended = self.window
        handled = sum(1 for t in first.values() if began <= t <= ended)
        seconds = max(ended - began, 1e-9)
        return {
            "offered_per_second": self.rate,
            "handled_per_second": round(handled / seconds, 1),
            "handled_per_second_per_shard": round(handled / seconds / SHARDS, 2),
        }

    def dynamodb_requests(self, handled: int) -> dict[str, Any]:
        """DynamoDB requests that reached moto through the proxy, by table, and per record."""
        proxy = self.dynamodb_proxy
        leases = proxy.forwarded_to(self.app)
        guard = proxy.forwarded_to(self.guard_table) if self.guard_table else 0
        per = max(handled, 1)
        return {
            "lease_table": leases,
            "guard_table": guard,
            "lease_table_per_record": round(leases / per, 4),
            "guard_table_per_record": round(guard / per, 4),
            "per_record": round((leases + guard) / per, 4),
            "failed_by_proxy": len(proxy.injections),
        }

    def result(
        self, report: chaos_check.Report, drained: float | None, took: float
    ) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for kind, *_ in self.faults.entries:
            counts[kind] = counts.get(kind, 0) + 1
        history = [] if self.fleet is None else self.fleet.history
        exits = {i.name: i.process.returncode for i in history}
        pids = {i.name: i.process.pid for i in history}
        # Exited with an error although this script did not kill it (a SIGTERM must end in 0).
        crashed = [
            i.name
            for i in history
            if i.process.returncode not in (0, None)
            and not (i.name in self.signalled and i.process.returncode == -signal.SIGKILL)
        ]
        return {
            "mode": MODE_OF[(self.guard, self.batch)],
            "duration": self.args.duration,
            "commit": self.args.commit,
            "idempotency_guard": self.guard,
            "batched_guard": self.batch,
            "rate": self.rate,
            "faults": counts,
            "actions_failed": self.skipped,
            "drained_after": None if drained is None else round(drained, 1),
            "throughput": self.throughput(),
            "dynamodb_requests": self.dynamodb_requests(report.handled),
            "worker_pids": pids,
            "worker_exit_codes": exits,
            "workers_failed": crashed,
            "took": round(took, 1),
            "run_dir": str(self.dir),
            "passed": report.passed and not crashed and not self.skipped,
            "report": report.as_dict(),
        }


def source_commit(paths: tuple[str, ...] = ("src", "bench")) -> str:
    """The commit of the code this run measured ("+" if the work tree had changes under
    ``paths``)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, cwd=HERE, check=True
        ).stdout.decode()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            capture_output=True,
            cwd=HERE.parent,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.strip() + ("+" if dirty.strip() else "")


# --- tables ---------------------------------------------------------------------------------

MODES = ("noguard", "guard", "guard-batch")
MODE_OF = {(False, False): "noguard", (True, False): "guard", (True, True): "guard-batch"}
MODE_TITLES = {
    "noguard": "lease fencing alone",
    "guard": "with the idempotency guard",
    "guard-batch": "with the guard, batched",
}


def _modes(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [result["modes"][m] for m in MODES if m in result["modes"]]


def _progress(r: dict[str, Any]) -> str:
    if r["progress_max"] is None:
        return "-"
    met = "" if r.get("progress_goal_met", True) else ": missed"
    return f"{r['progress_p50']:g} / {r['progress_max']:g} s (goal {r['progress_goal']:g} s{met})"


def _interrupted(mode: dict[str, Any], kind: str) -> str:
    faults = [p for p in mode["report"]["per_fault"] if p["kind"] == kind]
    if not faults:
        return "-"
    return f"{sum(p['interrupted'] for p in faults):,} ({len(faults)} faults)"


def _failed_requests(mode: dict[str, Any], kind: str) -> str:
    faults = [p for p in mode["report"]["per_fault"] if p["kind"] == kind]
    if not faults:
        return "-"
    return f"{sum(p['requests_failed'] or 0 for p in faults):,} ({len(faults)} faults)"


FAULT_NAMES = {
    "kill": "kill -9",
    "stop": "SIGSTOP",
    "term": "SIGTERM",
    "kinesis_brownout": "Kinesis brownout",
    "dynamodb_brownout": "lease-table brownout",
    "throttle": "throttling",
    "split": "split",
    "merge": "merge",
    chaos_check.SLOW_TABLE: "lease lapsed on a slow lease table",
}


def _causes(r: dict[str, Any]) -> str:
    """``1,953: kill 374, ... (0 unexplained)``: replays by the fault they are attributed to."""
    by_cause = r["duplicates_by_cause"]
    unexplained = by_cause.get("unexplained", 0)
    causes = ", ".join(
        f"{FAULT_NAMES.get(k, k)} {v:,}"
        for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])
        if k != "unexplained"
    )
    return f"{r['duplicates']:,}{': ' + causes if causes else ''} ({unexplained} unexplained)"


def _recovery_by_kind(r: dict[str, Any]) -> str:
    """The slowest shard's recovery per fault class, slowest class first."""
    worst: dict[str, float] = {}
    for row in r["progress"]:
        if row.get("max") is not None:
            kind = row["kind"]
            worst[kind] = max(worst.get(kind, 0.0), row["max"])
    return ", ".join(
        f"{FAULT_NAMES.get(k, k)} {v:.1f}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1])
    )


def _per_kind(mode: dict[str, Any], field_name: str, kinds: tuple[str, ...]) -> str:
    """Totals of a per-fault figure for each of ``kinds``, ``a / b / c``."""
    totals = []
    for kind in kinds:
        faults = [p for p in mode["report"]["per_fault"] if p["kind"] == kind]
        totals.append("-" if not faults else f"{sum(p[field_name] or 0 for p in faults):,}")
    return " / ".join(totals)


def _rows(mode: dict[str, Any]) -> list[tuple[str, str]]:
    r = mode["report"]
    depth = max(r["replay_depth_max"].values(), default=0.0)
    latency = r["latency_after_faults"]
    frozen = r["frozen_calls"]
    outlived = max((f["outlived_lease"] for f in frozen), default=0.0)
    dynamo = mode["dynamodb_requests"]
    rows = [
        ("seconds of faults (commit)", f"{mode['duration']:.0f} ({mode['commit']})"),
        (
            "records/s offered / handled during the faults",
            f"{mode['rate']:g} / {mode['throughput']['handled_per_second']:g}",
        ),
        ("records/s handled per shard", f"{mode['throughput']['handled_per_second_per_shard']:g}"),
        (
            "DynamoDB requests per record (lease table + guard table)",
            f"{dynamo['per_record']:.3f} ({dynamo['lease_table_per_record']:.3f} + "
            f"{dynamo['guard_table_per_record']:.3f})",
        ),
        (
            "records sent / acknowledged / reported failed",
            f"{r['sent']:,} / {r['written']:,} / {r['producer_gave_up']}",
        ),
        ("sent but neither acknowledged nor failed", f"{r['unreconciled']}"),
        ("records lost (acknowledged, never handled)", f"{r['lost']}"),
        ("poison records dead-lettered", f"{r['poison_dead_lettered']} of {r['poison_written']}"),
        ("per-key order violations", f"{r['order_violations']}"),
        ("two workers in one shard's handler at once", f"{r['overlaps']}"),
        (
            "  ... calls frozen by SIGSTOP, outlived their lease by (max)",
            f"{len(frozen)}, {outlived:.2f} s",
        ),
        ("two live owners of a lease (lease events)", f"{r['double_owners']}"),
        ("records handled twice (by cause)", _causes(r)),
        ("  ... replayed work before its fault (max; checkpoint interval 2 s)", f"{depth:.2f} s"),
        ("calls in flight hit by kill -9", _interrupted(mode, "kill")),
        ("calls in flight hit by SIGSTOP", _interrupted(mode, "stop")),
        ("calls in flight hit by a lease-table brownout", _interrupted(mode, "dynamodb_brownout")),
        (
            "requests failed by the proxy: Kinesis brownout",
            _failed_requests(mode, "kinesis_brownout"),
        ),
        ("requests failed by the proxy: throttling", _failed_requests(mode, "throttle")),
        (
            "requests failed by the proxy: lease-table brownout",
            _failed_requests(mode, "dynamodb_brownout"),
        ),
        ("every shard handling again after a fault: p50 / max", _progress(r)),
        ("  ... slowest shard by fault class (s)", _recovery_by_kind(r) or "-"),
        ("shards that never did", f"{len(r['stalled'])}"),
        (
            "caught up after the last fault ended",
            "no" if r["caught_up_after"] is None else f"{r['caught_up_after']:g} s",
        ),
        (
            "latency after the faults, p50 / p99",
            "-" if latency is None else f"{latency['p50']:.2f} / {latency['p99']:.2f} s",
        ),
        ("worker processes that failed on their own", f"{len(mode['workers_failed'])}"),
        ("passed", "yes" if mode["passed"] else f"no: {', '.join(r['failures']) or 'actions'}"),
    ]
    return rows


def render(result: dict[str, Any]) -> str:
    """The soak's table, one column per mode, from its JSON."""
    modes = _modes(result)
    per_mode = [_rows(m) for m in modes]
    lines = [
        "| check | " + " | ".join(MODE_TITLES[m["mode"]] for m in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for i, (name, _) in enumerate(per_mode[0]):
        lines.append(f"| {name} | " + " | ".join(rows[i][1] for rows in per_mode) + " |")
    faults = ", ".join(f"{k} {v}" for k, v in sorted(modes[0]["faults"].items()))
    lines.append("")
    lines.append(
        f"(faults per mode: {faults}; {result['shards']} shards, "
        f"{result['workers']} workers, handler {result['handler']}; DynamoDB latency "
        f"{result['dynamodb_latency_ms']} ms added by the fault proxy; failover "
        f"{result['failover_time']:g} s; {result['machine']})"
    )
    return "\n".join(lines)


def render_faults(result: dict[str, Any]) -> str:
    """Per fault of the run without the guard: what it hit and how fast shards recovered."""
    return _faults_table(_modes(result)[0])


def render_faults_guard(result: dict[str, Any]) -> str:
    """Per fault of the run with the idempotency guard."""
    guarded = [m for m in _modes(result) if m["mode"] != "noguard"]
    if not guarded:
        return "(the run measured no mode with the guard)"
    return _faults_table(guarded[0])


def _faults_table(mode: dict[str, Any]) -> str:
    began = min((p["start"] for p in mode["report"]["per_fault"]), default=0.0)
    lines = [
        "| at (s) | fault | lasted (s) | requests failed | calls in flight hit | "
        "shards handling again: p50 / max (s) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    progress_rows = mode["report"]["progress"]
    for i, p in enumerate(mode["report"]["per_fault"]):
        pr = progress_rows[i] if i < len(progress_rows) else None
        recovery = "-" if pr is None or pr["max"] is None else f"{pr['p50']:g} / {pr['max']:g}"
        failed = "-" if p["requests_failed"] is None else f"{p['requests_failed']:,}"
        target = f" {p['target']}" if p["target"] else ""
        pid = f" (pid {p['pid']})" if p["pid"] else ""
        lines.append(
            f"| {p['start'] - began:.0f} | {p['kind']}{target}{pid} | {p['end'] - p['start']:.1f} "
            f"| {failed} | {p['interrupted']:,} | {recovery} |"
        )
    return "\n".join(lines)


def render_promises(result: dict[str, Any]) -> str:
    """The faults guide's summary of what the soak showed, from its JSON."""
    modes = _modes(result)
    faults = sum(modes[0]["faults"].values())

    def cell(mode: dict[str, Any], name: str) -> str:
        r = mode["report"]
        frozen = r["frozen_calls"]
        return {
            "lost": f"{r['lost']} of {r['written']:,} acknowledged",
            "order": f"{r['order_violations']}",
            "overlaps": f"{r['overlaps']}",
            "frozen": f"{len(frozen)}",
            "owners": f"{r['double_owners']}",
            "stuck": f"{len(r['stalled'])}",
            "poison": f"{r['poison_dead_lettered']} of {r['poison_written']}",
            "twice": _causes(r),
            "hit": f"{sum(p['interrupted'] for p in r['per_fault']):,}",
            "hit_by": _per_kind(mode, "interrupted", ("kill", "stop", "dynamodb_brownout")),
            "failed_by": _per_kind(
                mode, "requests_failed", ("kinesis_brownout", "throttle", "dynamodb_brownout")
            ),
            "recovery": _progress(r),
            "recovery_by": _recovery_by_kind(r) or "-",
            "faults": ", ".join(
                f"{FAULT_NAMES.get(k, k)} {v}" for k, v in sorted(mode["faults"].items())
            ),
        }[name]

    names = [
        ("faults", "faults injected"),
        ("lost", "records lost"),
        ("order", "per-key order violations"),
        ("overlaps", "two workers in one shard's handler at once"),
        ("frozen", "... besides calls frozen by SIGSTOP mid-way, ended after the next owner began"),
        ("owners", "two live owners of one lease"),
        ("stuck", "shards that stopped progressing"),
        ("poison", "poison records dead-lettered"),
        ("twice", "records handled twice, by the fault each is attributed to"),
        ("hit", "handler calls in flight hit by a fault"),
        ("hit_by", "... by kill -9 / SIGSTOP / lease-table brownout"),
        ("failed_by", "requests the proxy failed: Kinesis brownout / throttling / lease table"),
        ("recovery", "every shard handling again after a fault: p50 / max"),
        ("recovery_by", "... slowest shard by fault class (s)"),
    ]
    header = " | ".join(f"{MODE_TITLES[m['mode']]}, {m['rate']:g} records/s" for m in modes)
    lines = [
        f"| `bench/chaos.py`, {result['duration'] / 60:.0f} min per mode, {faults} faults | "
        f"{header} |",
        "|---|" + "---:|" * len(modes),
    ]
    lines += [f"| {title} | " + " | ".join(cell(m, n) for m in modes) + " |" for n, title in names]
    return "\n".join(lines)


def render_guard_cost(result: dict[str, Any]) -> str:
    """The idempotency guard's cost, measured in the same run as the mode without it."""
    modes = _modes(result)
    if len(modes) < 2:
        return "(the run measured one mode only)"
    lines = [
        "| | " + " | ".join(MODE_TITLES[m["mode"]] for m in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    rows = [
        ("records/s offered", lambda m: f"{m['rate']:g}"),
        (
            "records/s handled per shard",
            lambda m: f"{m['throughput']['handled_per_second_per_shard']:g}",
        ),
        (
            "DynamoDB requests per record, guard table",
            lambda m: f"{m['dynamodb_requests']['guard_table_per_record']:.2f}",
        ),
        (
            "DynamoDB requests per record, lease table",
            lambda m: f"{m['dynamodb_requests']['lease_table_per_record']:.3f}",
        ),
        (
            "latency after the faults, p99",
            lambda m: (
                "-"
                if m["report"]["latency_after_faults"] is None
                else f"{m['report']['latency_after_faults']['p99']:.2f} s"
            ),
        ),
    ]
    for name, value in rows:
        lines.append(f"| {name} | " + " | ".join(value(m) for m in modes) + " |")
    return "\n".join(lines)


def run_mode(args: argparse.Namespace, mode: str, run_dir: Path) -> dict[str, Any]:
    """One mode on fresh servers (kinesis-local slows as its streams fill)."""
    from shardflow.local import KinesisLocalServer, MotoServer

    guard = mode != "noguard"
    batch = mode == "guard-batch"
    rate = {"noguard": args.rate, "guard": args.guard_rate, "guard-batch": args.batch_rate}[mode]
    print(f"mode {mode}: {rate:g} records/s, {args.duration:.0f} s of faults", flush=True)
    with KinesisLocalServer(shard_limit=100) as kinesis, MotoServer() as moto:
        soak = Soak(
            args,
            kinesis.endpoint_url,
            moto.endpoint_url,
            guard=guard,
            batch=batch,
            rate=rate,
            run_dir=run_dir,
        )
        return soak.run()


def _milliseconds(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--short", action="store_true", help="120 s, compressed schedule")
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="records/s without the guard"
    )
    parser.add_argument(
        "--guard-rate",
        type=float,
        default=DEFAULT_GUARD_RATE,
        help="records/s with the guard (the most it sustains on the local stack)",
    )
    parser.add_argument(
        "--batch-rate",
        type=float,
        default=DEFAULT_BATCH_RATE,
        help="records/s with the batched guard (the most it sustains on the local stack)",
    )
    parser.add_argument(
        "--modes",
        default="noguard,guard",
        help="comma-separated: noguard (lease fencing alone), guard (the DynamoDB idempotency "
        "guard, two writes a record), guard-batch (the guard batching claims and completions; "
        "not a default: moto's TransactWriteItems copies the whole table per item, so on moto "
        "it slows as the guard's table fills; bench/guard_cost.py measures it on fresh tables)",
    )
    parser.add_argument(
        "--latency",
        type=_milliseconds,
        default=(5.0, 10.0),
        help="ms range the fault proxy adds to every DynamoDB request ('0,0': none)",
    )
    parser.add_argument(
        "--slow-fraction",
        type=float,
        default=0.05,
        help="share of handler calls taking 50-200 ms (the rest take about 1 ms)",
    )
    parser.add_argument(
        "--aim",
        type=float,
        default=10.0,
        help="seconds a kill, SIGSTOP or lease-table brownout may wait for its victim (any "
        "worker for a brownout) to be inside a handler call",
    )
    parser.add_argument("--poison-every", type=float, default=20.0)
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to catch up")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--skip", action="append", default=[], help="leave out a fault class (repeatable)"
    )
    parser.add_argument("--results", help="JSON path (default bench/results/chaos.json)")
    parser.add_argument("--keep", help="directory for the run's logs (default: a temp dir)")
    args = parser.parse_args()
    if args.short:
        args.duration = min(args.duration, 120.0)
        args.poison_every = min(args.poison_every, 15.0)
    if args.latency == (0.0, 0.0):
        args.latency = None
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes a comma-separated selection of {', '.join(MODES)}")

    fleet_kit.stop_on_sigterm()  # unwind: the finally blocks stop every process it started

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "chaos")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "chaos")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    print(f"chaos soak: {args.duration:.0f} s of faults per mode, seed {args.seed}", flush=True)
    args.commit = source_commit()  # at the start: the code this run runs, not the code at its end
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="chaos-"))
    began = time.monotonic()
    results = {mode: run_mode(args, mode, root / mode) for mode in modes}
    result: dict[str, Any] = {
        "benchmark": "chaos",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "duration": args.duration,
        "short": args.duration < 300,
        "seed": args.seed,
        "shards": SHARDS,
        "workers": WORKERS,
        "failover_time": FAILOVER,
        "handler": f"~1 ms, {args.slow_fraction:.0%} of calls 50-200 ms",
        "dynamodb_latency_ms": "none"
        if args.latency is None
        else f"{args.latency[0]:g}-{args.latency[1]:g}",
        "faults_left_out": sorted(args.skip),
        "modes": results,
        "passed": all(r["passed"] for r in results.values()),
        "took": round(time.monotonic() - began, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "commit": args.commit,
    }
    text = render(result)
    print("\n" + text)
    for mode, r in results.items():
        report = r["report"]
        print(f"\n{mode}: logs {r['run_dir']}; passed: {r['passed']} {report['failures']}")
        for name in (
            "lost",
            "order",
            "overlap",
            "interleaved",
            "duplicate",
            "double_owner",
            "reconcile",
        ):
            for example in report[f"{name}_examples"]:
                print(f"  {name}: {example}")
        for line in report["uninterrupting"] + report["silent_faults"] + report["stalled"]:
            print(f"  {line}")
    result["table"] = text
    path = Path(args.results) if args.results else RESULTS / "chaos.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
