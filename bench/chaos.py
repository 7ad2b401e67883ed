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

HERE = Path(__file__).parent
RESULTS = HERE / "results"
REGION = "us-east-1"
SHARDS = 16
WORKERS = 4
KEYS = 64
FAILOVER = 6.0

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
    (540, "kinesis_brownout", 10),
    (540, "dynamodb_brownout", 10),
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
    return [(at * duration / length, action, d) for at, action, d in base if action not in skip]


# --- processes ------------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One worker process: ``w2.1`` is the second start of worker slot 2."""

    name: str
    process: subprocess.Popen[bytes]
    frozen: bool = False


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

    def live(self) -> list[tuple[int, Incarnation]]:
        with self.lock:
            return [
                (slot, inc)
                for slot, inc in sorted(self.slots.items())
                if inc.process.poll() is None and not inc.frozen
            ]

    def kill_all(self) -> None:
        """SIGCONT and SIGKILL every process still running (by its PID)."""
        for process in self.every:
            if process.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, sig)
                process.wait(10)


class FaultLog:
    """``faults.tsv``: kind, target, start, end (wall clock), one line per fault."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[tuple[str, str, float, float]] = []

    def add(self, kind: str, target: str, start: float, end: float) -> None:
        with self._lock:
            self.entries.append((kind, target, start, end))
            with self.path.open("a") as file:
                file.write(f"{kind}\t{target}\t{start:.6f}\t{end:.6f}\n")
        print(f"  {time.strftime('%H:%M:%S')} {kind} {target} ({end - start:.1f} s)", flush=True)


# --- the soak -------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, kinesis_url: str, moto_url: str) -> None:
        from shardflow.testing.faults import FaultProxy

        self.args = args
        self.rng = random.Random(args.seed)
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.stream = f"chaos-{stamp}"
        self.app = f"chaos-app-{stamp}"
        self.guard_table = f"chaos-guard-{stamp}" if args.guard else ""
        self.kinesis_url = kinesis_url
        self.moto_url = moto_url
        self.dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="chaos-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.kinesis_proxy = FaultProxy(kinesis_url, seed=args.seed)
        self.dynamodb_proxy = FaultProxy(moto_url, seed=args.seed + 1)
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
            str(self.args.rate),
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
        rule = proxy.add(fault, service="DynamoDB", probability=0.9)
        self._hold([rule], proxy, "dynamodb_brownout", lasting)

    def _hold(self, rules: list[int], proxy: Any, kind: str, lasting: float) -> None:
        began = time.time()
        time.sleep(lasting)
        for rule in rules:
            proxy.remove(rule)
        self.faults.add(kind, "", began, time.time())

    def _victim(self) -> tuple[int, Incarnation] | None:
        assert self.fleet is not None
        live = self.fleet.live()
        return self.rng.choice(live) if live else None

    def kill(self) -> None:
        assert self.fleet is not None
        chosen = self._victim()
        if chosen is None:
            return
        slot, victim = chosen
        at = time.time()
        self.signalled.add(victim.name)
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(10)
        self.faults.add("kill", victim.name, at, at)
        time.sleep(3.0)
        self.fleet.start(slot)

    def stop(self, lasting: float) -> None:
        chosen = self._victim()
        if chosen is None:
            return
        _, victim = chosen
        victim.frozen = True
        began = time.time()
        os.kill(victim.process.pid, signal.SIGSTOP)
        time.sleep(lasting)
        os.kill(victim.process.pid, signal.SIGCONT)
        victim.frozen = False
        self.faults.add("stop", victim.name, began, time.time())

    def rolling(self) -> None:
        assert self.fleet is not None
        for slot, victim in self.fleet.live():
            began = time.time()
            self.signalled.add(victim.name)
            victim.process.send_signal(signal.SIGTERM)
            try:
                victim.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(victim.process.pid, signal.SIGKILL)
                victim.process.wait(10)
                self.faults.add("kill", victim.name, time.time(), time.time())
            self.faults.add("term", victim.name, began, time.time())
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
        live = self.fleet.live()
        for _, inc in live:
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
        )

    def result(
        self, report: chaos_check.Report, drained: float | None, took: float
    ) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for kind, *_ in self.faults.entries:
            counts[kind] = counts.get(kind, 0) + 1
        history = [] if self.fleet is None else self.fleet.history
        exits = {i.name: i.process.returncode for i in history}
        # Exited with an error although this script did not kill it (a SIGTERM must end in 0).
        crashed = [
            i.name
            for i in history
            if i.process.returncode not in (0, None)
            and not (i.name in self.signalled and i.process.returncode == -signal.SIGKILL)
        ]
        return {
            "benchmark": "chaos",
            "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
            "duration": self.args.duration,
            "short": self.args.duration < 300,
            "seed": self.args.seed,
            "rate": self.args.rate,
            "idempotency_guard": self.args.guard,
            "shards": SHARDS,
            "workers": WORKERS,
            "failover_time": FAILOVER,
            "faults": counts,
            "faults_left_out": sorted(self.args.skip),
            "actions_failed": self.skipped,
            "drained_after": None if drained is None else round(drained, 1),
            "worker_exit_codes": exits,
            "workers_failed": crashed,
            "took": round(took, 1),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}",
            "commit": source_commit(),
            "run_dir": str(self.dir),
            "report": report.as_dict(),
        }


def source_commit() -> str:
    """The commit of the code this run measured ("+" if the work tree had changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, cwd=HERE, check=True
        ).stdout.decode()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            capture_output=True,
            cwd=HERE.parent,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.strip() + ("+" if dirty.strip() else "")


def render(result: dict[str, Any]) -> str:
    """The soak's table, from its JSON."""
    r = result["report"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(result["faults"].items()))
    causes = ", ".join(f"{k} {v}" for k, v in sorted(r["duplicates_by_cause"].items())) or "-"
    rows = [
        ("records written (acknowledged)", f"{r['written']:,}"),
        (
            "poison records (dead-lettered / written)",
            f"{r['poison_dead_lettered']} / {r['poison_written']}",
        ),
        ("dead letters written twice (replayed after a fault)", r["dead_letters_repeated"]),
        ("records lost (never handled by the end of the run)", r["lost"]),
        ("per-key order violations", r["order_violations"]),
        ("two workers in one shard's handler at once", r["overlaps"]),
        ("  ... of which a SIGSTOP froze a call", r["overlaps_frozen"]),
        ("interleaved ownership stretches", r["interleaved"]),
        ("records handled twice (by cause)", f"{r['duplicates']} ({causes})"),
        ("shards not progressing at the end", len(r["stuck_shards"])),
        (
            "caught up after faults stopped",
            "no" if result["drained_after"] is None else f"{result['drained_after']} s",
        ),
        ("worker processes that failed on their own", len(result.get("workers_failed", []))),
    ]
    lines = ["| check | result |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines.append("")
    lines.append(
        f"({result['duration']:.0f} s of faults: {faults}; {result['shards']} shards, "
        f"{result['workers']} workers, {result['rate']:g} records/s, failover "
        f"{result['failover_time']:g} s; {result['machine']}; "
        f"commit {result.get('commit', 'unknown')})"
    )
    return "\n".join(lines)


def render_promises(result: dict[str, Any]) -> str:
    """The faults guide's summary of what the soak showed, from its JSON."""
    r = result["report"]
    unexplained = r["duplicates_by_cause"].get("unexplained", 0)
    attributed = r["duplicates"] - unexplained
    faults = sum(result["faults"].values())
    rows = [
        ("records lost", f"{r['lost']} of {r['written']:,} acknowledged"),
        ("per-key order violations", r["order_violations"]),
        ("two workers in one shard's handler at once", r["overlaps"]),
        (
            "... besides calls frozen by SIGSTOP mid-way, ended after the next owner began",
            r["overlaps_frozen"],
        ),
        ("shards not progressing at the end", len(r["stuck_shards"])),
        (
            "poison records dead-lettered",
            f"{r['poison_dead_lettered']} of {r['poison_written']}",
        ),
        (
            "records handled twice",
            f"{r['duplicates']} ({attributed} attributed to a fault, {unexplained} unexplained)",
        ),
    ]
    lines = [
        f"| `bench/chaos.py`, {result['duration'] / 60:.0f} min, {faults} faults | result |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults")
    parser.add_argument("--short", action="store_true", help="120 s, compressed schedule")
    parser.add_argument("--rate", type=float, default=20.0, help="records/s, all keys")
    parser.add_argument("--poison-every", type=float, default=20.0)
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to catch up")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--skip", action="append", default=[], help="leave out a fault class (repeatable)"
    )
    parser.add_argument(
        "--no-guard",
        dest="guard",
        action="store_false",
        help="workers without the DynamoDB idempotency guard: every record reaches a handler",
    )
    parser.add_argument("--results", help="JSON path (default bench/results/chaos.json)")
    parser.add_argument("--keep", help="directory for the run's logs (default: a temp dir)")
    args = parser.parse_args()
    if args.short:
        args.duration = min(args.duration, 120.0)
        args.poison_every = min(args.poison_every, 15.0)
    from shardflow.local import KinesisLocalServer, MotoServer

    # SIGTERM to this script: unwind (the finally blocks stop every process it started).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "chaos")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "chaos")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    print(f"chaos soak: {args.duration:.0f} s of faults, seed {args.seed}", flush=True)
    with KinesisLocalServer(shard_limit=100) as kinesis, MotoServer() as moto:
        soak = Soak(args, kinesis.endpoint_url, moto.endpoint_url)
        result = soak.run()
    text = render(result)
    print("\n" + text)
    print(f"\nlogs: {result['run_dir']}; passed: {result['report']['passed']}")
    for name in ("lost", "order", "overlap", "interleaved", "duplicate"):
        for example in result["report"][f"{name}_examples"]:
            print(f"  {name}: {example}")
    result["table"] = text
    path = Path(args.results) if args.results else RESULTS / "chaos.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if result["report"]["passed"] else 1)


if __name__ == "__main__":
    main()
