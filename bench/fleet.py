"""A fleet of real worker processes on one large stream: start-up, a rolling restart, scaling,
a kill -9 and an idle minute, each reported per shard.

Kinesis runs on kinesalite, the lease table on dynalite (``--lease-server dynalite``, the
default: it answers requests concurrently; it has no DynamoDB Streams, so lease pick-up polls
the table) or moto's server (``--lease-server moto``: serialized, ~110 conditional writes/s;
pick-up reads its DynamoDB stream). One stream of S shards (default 256); a producer thread
writes R records/s to every shard (default 2, explicit hash keys), each record carrying a
unique id and its send time. N worker processes (default 8) run ``shardflow``'s Consumer
(``Consumer.run``; SIGTERM stops one gracefully, handing its leases over) and append
``worker, shard, record id, time`` to a file of their own for every record handled (one
unbuffered write each, so a kill -9 loses no line of what was handled). Every worker counts
its AWS requests per operation with botocore's ``before-call``/``after-call`` hooks on its
clients' session (a dict update per call) and writes the totals to a file once a second;
psutil samples every process's CPU time and RSS once a second.

Lease modes (``--lease-mode``, default ``both``): the application's lease mode is stored in
its table before any worker starts, ``per-lease`` (every lease renewed on its own, the KCL's
way) or ``heartbeat`` (one heartbeat item per worker; a lease is written when taken,
checkpointed, handed off or released). ``both`` runs the whole bench once per mode, each on
fresh emulators, per-lease first; the heartbeat run uses the shard count the per-lease run
settled on, so that the two compare on the same fleet. The result holds the runs side by
side (``runs``, keyed by mode), and the goals are printed per mode.

Phases, one after the other on the same stream and lease table, records flowing throughout
except in the idle minute:

    1. start-up: N workers started at once; time until every shard is held and has a record
       handled, time until the leases are balanced, balance (max - min leases of a worker);
       then a steady window (the load check: is the local stack keeping up?);
    2. rolling restart of all N workers, one at a time: start a replacement, wait until it
       holds or has asked for a lease (or, when it wants none because every worker is at the
       target of ceil(leases / workers), until its consumer has started), SIGTERM the old
       one, wait for it to exit;
    3. scale-out N -> N+2 (two workers started at once), then scale-in N+2 -> N (the two
       newest workers get SIGTERM at the same moment);
    4. idle minute: the producer pauses; lease-table requests per minute by operation, CPU
       and RSS of each worker (the fleet is left alone: the bench itself sends nothing);
    5. kill -9 of the worker holding the most leases: per shard of it, the time from the kill
       to its first record handled by another worker.

Per shard and phase: the longest gap between consecutive records handled and their p99, the
p99 and worst delay of a record (handled minus written), records handled twice (the second
handling falls in the phase) and never handled (written in the phase). At 2 records/s a shard's
records are 0.5 s apart, so a p99 *gap* at or above 0.5 s is the rate, not a pause: the p99
goal is judged on the record delay, which a pause lengthens and the rate does not; the worst
gap is judged as it is. For every shard that changed hands in a planned move the workers'
logs give the steps of its pause (bench/fleet_timeline.py): the old owner's last record, the
handoff begun, drained and handed over, claimed by the new owner, its reader started, its
first record; the stages' medians and the slowest moves are printed. After the last phase the producer stops, the tail is drained and every
record id written is looked up in what the workers handled.

Goals (printed met / MISSED): rolling restart worst gap <= 1 s, record delay p99 <= 0.5 s,
0 twice, 0 lost; scale-out and scale-in judged the same way (planned moves); kill -9 takeover
<= failover_time + 2 s for every shard of the dead worker; balance within 1 lease.

If the local stack cannot keep up with S shards on the machine (start-up does not complete,
or in the steady window the record delay p99 exceeds 1 s or the producer falls behind), the
run prints where it saturated (each emulator's CPU, request latencies seen by the workers,
the record delay) and starts over at half the shards, down to ``--min-shards`` (64), saying so.

Lease timings as bench/handoff.py: failover 6 s (renew 1.975 s, take cycle 12.05 s), polling
idle 0.2 s, pick-up every 0.2 s, handoff timeout 10 s, drain timeout 5 s.

    .venv/bin/python bench/fleet.py                 # 256 shards, 8 workers, both modes (~15 min)
    .venv/bin/python bench/fleet.py --lease-mode heartbeat
    .venv/bin/python bench/fleet.py --short         # 64 shards, 4 workers, shorter phases
    .venv/bin/python bench/fleet.py --lease-server moto --shards 64
    .venv/bin/python bench/fleet.py --shards 128 --phases rolling,scale --no-fallback \
        --no-probe --repeat 3 --results-name fleet-128-moves.json   # medians of 3 rounds
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fleet_timeline
from fleet_kit import (
    DRAIN_TIMEOUT,
    FAILOVER,
    HANDOFF_TIMEOUT,
    IDLE_TIME,
    LATENCY_EDGES,
    PICKUP_INTERVAL,
    REGION,
    SUCCESSOR_WAIT,
    TAKE_EVERY,
    Handled,
    Producer,
    percentile,
    read_counts,
    run_worker,
    stack_clients,
    stack_env,
    stop_on_sigterm,
    wait_for,
)

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
PHASES = ("startup", "rolling", "scale", "idle", "kill")
TAKEOVER_SLACK = 2.0  # kill -9 goal: failover_time + this
PLANNED_GAP = 1.0  # planned moves: worst gap goal
PLANNED_DELAY_P99 = 0.5  # planned moves: record delay p99 goal
STAY_PAUSE = 0.75  # stays over this, in results written before they said (fleet_timeline)
SUSTAINED_DELAY_P99 = 1.0  # the load check: record delay p99 in the steady window at most this
LEASE_SERVICES = ("dynamodb", "dynamodb-streams")  # botocore service ids, as the hooks see them
READER_STARTED = re.compile(
    r"^(\d+\.\d+) shardflow\.consumer shard (\S+) \(stream [^)]*\): "
    r"(?:resuming after checkpoint|starting at)"
)


LEASE_MODES = ("per-lease", "heartbeat")


@dataclass(frozen=True)
class Config:
    shards: int = 256
    workers: int = 8
    rate: float = 2.0
    lease_server: str = "dynalite"
    lease_modes: tuple[str, ...] = LEASE_MODES
    """Each mode is a run of its own (fresh emulators, the same phases), in this order."""
    lease_mode: str = "per-lease"
    """The mode of the run under way (stored in its lease table before any worker starts)."""
    phases: tuple[str, ...] = PHASES
    settle: float | None = None  # start-up: seconds to wait at most (None: 60 + shards / 2)
    steady: float = 15.0  # the steady window after start-up (the load check)
    observe: float = 6.0  # seconds observed after each action
    idle: float = 60.0
    min_shards: int = 64
    fallback: bool = True  # start over at half the shards if the stack does not keep up
    probe: bool = False  # first, each emulator alone under load (where it saturates)

    @property
    def settle_time(self) -> float:
        return self.settle if self.settle is not None else 60.0 + self.shards / 2


DEFAULT = Config(probe=True)
SHORT = Config(shards=64, workers=4, steady=8.0, observe=4.0, idle=20.0, min_shards=16)


# --- reading what the workers do ----------------------------------------------------------------


class HandledLog:
    """The workers' record files, read incrementally (only what was appended since last time)."""

    def __init__(self) -> None:
        self.paths: dict[str, Path] = {}
        self.offsets: dict[str, int] = {}
        self.rows: list[Handled] = []
        self.first: dict[str, float] = {}  # shard -> first handled
        self.last: dict[str, tuple[float, str]] = {}  # shard -> (last handled, by whom)
        self._lock = threading.Lock()

    def add(self, name: str, path: Path) -> None:
        self.paths[name] = path
        self.offsets[name] = 0

    def poll(self) -> None:
        with self._lock:
            for name, path in self.paths.items():
                try:
                    with path.open("rb") as f:
                        f.seek(self.offsets[name])
                        data = f.read()
                except FileNotFoundError:
                    continue
                end = data.rfind(b"\n") + 1
                self.offsets[name] += end
                for line in data[:end].decode().splitlines():
                    parts = line.split("\t")
                    if len(parts) != 4:
                        continue
                    row = (parts[0], parts[1], parts[2], float(parts[3]))
                    self.rows.append(row)
                    self.first.setdefault(row[1], row[3])
                    if row[3] >= self.last.get(row[1], (0.0, ""))[0]:
                        self.last[row[1]] = (row[3], row[0])


class Sampler(threading.Thread):
    """CPU seconds and RSS of every process of the run, and the machine's busy CPU, every second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        import psutil

        self.psutil = psutil
        self.processes: dict[str, Any] = {"bench (producer)": psutil.Process()}
        self.samples: list[tuple[float, dict[str, float], dict[str, int], float]] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self.processes[name] = self.psutil.Process(pid)

    def run(self) -> None:
        while not self._halt.wait(1.0):
            self.sample()

    def sample(self) -> None:
        cpu: dict[str, float] = {}
        rss: dict[str, int] = {}
        with self._lock:
            processes = dict(self.processes)
        for name, process in processes.items():
            try:
                times = process.cpu_times()
                cpu[name] = times.user + times.system
                rss[name] = process.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.ZombieProcess):
                continue
        machine = self.psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        self.samples.append((time.time(), cpu, rss, busy))

    def cpu_between(self, start: float, end: float) -> tuple[dict[str, float], float]:
        """Cores used per process, and by the whole machine, between two wall times."""
        before = [s for s in self.samples if s[0] <= start]
        after = [s for s in self.samples if s[0] <= end]
        if not after:
            return {}, 0.0
        first = before[-1] if before else self.samples[0]
        last = after[-1]
        seconds = max(last[0] - first[0], 1e-6)
        used: dict[str, float] = {}
        for name, value in last[1].items():
            # A process started in the window counts from 0; one gone keeps its last reading.
            earlier = first[1].get(name, 0.0)
            used[name] = (value - earlier) / seconds
        for name in first[1]:
            if name not in last[1]:
                later = max((s[1][name] for s in after if name in s[1]), default=first[1][name])
                used[name] = (later - first[1][name]) / seconds
        return used, (last[3] - first[3]) / seconds

    def rss_at(self, at: float) -> dict[str, int]:
        got = [s for s in self.samples if s[0] <= at]
        return got[-1][2] if got else {}

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


# --- the fleet ----------------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    out: Path
    counts: Path
    process: subprocess.Popen[bytes]
    started: float


@dataclass
class Phase:
    name: str
    title: str
    started: float = 0.0
    ended: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    per_shard: dict[str, dict[str, Any]] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    goals: dict[str, bool] = field(default_factory=dict)
    judged: str = ""
    """"planned" or "kill": gaps, repeats and losses are read once the run is drained."""


class Saturated(Exception):
    """The local stack did not keep up with this many shards (the attempt's figures attached)."""

    def __init__(self, attempt: dict[str, Any]) -> None:
        super().__init__(attempt["reason"])
        self.attempt = attempt


class Fleet:
    def __init__(
        self,
        config: Config,
        kinesis: str,
        dynamodb: str,
        servers: dict[str, int],
        say: Any = print,
        *,
        fall_back: bool = False,
    ) -> None:
        """``fall_back``: raise :class:`Saturated` if the steady window shows the local stack
        not keeping up (else note it and go on)."""
        self.config = config
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.say = say
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.stream = f"bench-fleet-{config.shards}-{stamp}"
        self.app = f"bench-fleet-{config.shards}-{stamp}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"fleet-{config.shards}-"))
        self.workers: dict[str, Worker] = {}
        self.live: list[str] = []  # in start order
        self.log = HandledLog()
        self.sampler = Sampler()
        for name, pid in servers.items():
            self.sampler.watch(name, pid)
        self.env = stack_env(kinesis, dynamodb)
        self.ddb, self.kin = stack_clients(kinesis, dynamodb)
        self.producer: Producer | None = None
        self.shard_ids: list[str] = []
        self.phases: list[Phase] = []
        self._serial = itertools.count(1)
        self.marks: list[tuple[float, dict[str, dict[str, Any]]]] = []  # request totals
        self.fall_back = fall_back

    # -- workers

    def start_worker(self) -> str:
        name = f"w{next(self._serial):02d}"
        out = self.dir / f"{name}.tsv"
        counts = self.dir / f"{name}.counts.json"
        command = [
            sys.executable,
            __file__,
            "--child-worker",
            "--lease-server",
            self.config.lease_server,
            "--stream",
            self.stream,
            "--application",
            self.app,
            "--worker-id",
            name,
            "--out",
            str(out),
            "--counts",
            str(counts),
        ]
        log = (self.dir / f"{name}.log").open("wb")
        process = subprocess.Popen(command, env=self.env, stdout=log, stderr=log)
        self.workers[name] = Worker(name, out, counts, process, time.time())
        self.live.append(name)
        self.log.add(name, out)
        self.sampler.watch(name, process.pid)
        return name

    def stop_worker(self, name: str, *, kill: bool = False) -> float:
        """SIGTERM (or SIGKILL) one worker and wait for it to exit; seconds it took."""
        worker = self.workers[name]
        began = time.monotonic()
        worker.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.live.remove(name)
        try:
            worker.process.wait(60)
        except subprocess.TimeoutExpired:
            self.say(f"  {name} did not exit within 60 s of SIGTERM: killed")
            worker.process.kill()
            worker.process.wait(10)
        return time.monotonic() - began

    def stop_all(self) -> None:
        for name in list(self.live):
            self.workers[name].process.send_signal(signal.SIGTERM)
        for name in list(self.live):
            try:
                self.workers[name].process.wait(60)
            except subprocess.TimeoutExpired:
                self.workers[name].process.kill()
                self.workers[name].process.wait(10)
            self.live.remove(name)

    def kill_everything(self) -> None:
        for worker in self.workers.values():  # interrupted: leave no worker behind
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(10)

    # -- the lease table

    def leases(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.app, "ConsistentRead": True}
        try:
            while True:
                page = self.ddb.scan(**kwargs)
                items += page["Items"]
                if "LastEvaluatedKey" not in page:
                    return items
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except self.ddb.exceptions.ResourceNotFoundException:
            return []

    def table_entities(self) -> dict[str, Any]:
        """What the table says of its lease mode: the mode item, the heartbeat items."""
        items = self.leases()
        kinds = Counter(item.get("entityType", {}).get("S") for item in items)
        mode = next(
            (
                item.get("leaseMode", {}).get("S")
                for item in items
                if item.get("entityType", {}).get("S") == "SHARDFLOW_LEASE_MODE"
            ),
            None,
        )
        return {
            "lease_mode": mode or "per-lease",
            "heartbeat_items": kinds.get("SHARDFLOW_HEARTBEAT", 0),
            "lease_items": kinds.get(None, 0),
        }

    def owners(self) -> Counter[str]:
        got = Counter(item.get("leaseOwner", {}).get("S") for item in self.leases())
        return got

    def spread(self, owners: Counter[str]) -> int:
        """max - min leases of the live workers (a live worker holding none counts as 0)."""
        counts = [owners.get(name, 0) for name in self.live]
        return max(counts) - min(counts) if counts else 0

    def holds_or_asks(self, name: str) -> bool:
        for item in self.leases():
            if item.get("leaseOwner", {}).get("S") == name:
                return True
            if item.get("checkpointOwner", {}).get("S") == name:
                return True
            if item.get("shardflowHandoffRequest", {}).get("S", "").endswith(f":{name}"):
                return True
        return False

    def consumer_started(self, name: str) -> bool:
        """Whether the worker's log says its consumer started (after its first take cycle)."""
        try:
            return b" started as worker " in (self.dir / f"{name}.log").read_bytes()
        except FileNotFoundError:
            return False

    def readers_started(self, shards: set[str], since: float) -> dict[str, float]:
        """Seconds from ``since`` until a live worker's log says it started reading each of
        ``shards`` (its "resuming after checkpoint" / "starting at" line)."""
        started: dict[str, float] = {}
        for name in self.live:
            try:
                text = (self.dir / f"{name}.log").read_text(errors="replace")
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                match = READER_STARTED.match(line)
                if match is None or match.group(2) not in shards:
                    continue
                at = float(match.group(1)) - since
                if at > 0 and at < started.get(match.group(2), float("inf")):
                    started[match.group(2)] = at
        return started

    # -- counting requests

    def counts_now(self) -> dict[str, dict[str, Any]]:
        got = {}
        for name, worker in self.workers.items():
            counts = read_counts(worker.counts)
            if counts is not None:
                got[name] = counts
        return got

    # -- the run

    def run(self) -> dict[str, Any]:
        self.sampler.start()
        try:
            return self._run()
        finally:
            if self.producer is not None:
                self.producer.stop()
            self.kill_everything()
            self.sampler.stop()

    def _run(self) -> dict[str, Any]:
        began = time.monotonic()
        config = self.config
        self.kin.create_stream(StreamName=self.stream, ShardCount=config.shards)
        wait_for(
            lambda: (
                self.kin.describe_stream_summary(StreamName=self.stream)[
                    "StreamDescriptionSummary"
                ]["StreamStatus"]
                == "ACTIVE"
            ),
            60,
        )
        shards = self.list_shards()
        self.shard_ids = sorted(s["ShardId"] for s in shards)
        self.producer = Producer(
            self.kinesis,
            self.stream,
            {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards},
            config.rate,
        )
        if config.lease_mode != "per-lease":
            # The application's mode is stored in its table before any worker starts (as
            # `shardflow leases APP --set-mode heartbeat` does); every worker follows it.
            set_lease_mode(self.dynamodb, self.app, config.lease_mode, config.lease_server)
        self.producer.start()
        self.startup()
        if "rolling" in config.phases:
            self.rolling()
        if "scale" in config.phases:
            self.scale_out()
            self.scale_in()
        if "idle" in config.phases:
            self.idle()
        if "kill" in config.phases:
            self.kill()
        self.producer.stop()
        written = len(self.producer.written)
        drained = wait_for(lambda: self.drained(), 60, every=0.5)
        table = self.table_entities()  # the mode the fleet ran in, before the workers stop
        stopping = time.time()
        self.stop_all()
        self.log.poll()
        self.judge()
        verified = self.verify()
        verified["drained"] = drained
        verified["stop_seconds"] = round(time.time() - stopping, 2)
        self.say(
            f"verified: {written:,} records written, {verified['handled_ids']:,} ids handled, "
            f"{verified['twice']} twice, {verified['lost']} never handled"
        )
        return {
            "lease_mode": config.lease_mode,
            "stream": self.stream,
            "files": str(self.dir),
            "shards": config.shards,
            "workers": config.workers,
            "phases": [asdict(p) for p in self.phases],
            "table_at_end": table,
            "verified": verified,
            "producer": {
                "written": written,
                "retries": self.producer.failures,
                "put_p99": round(percentile(self.producer.put_seconds, 0.99), 3)
                if self.producer.put_seconds
                else None,
            },
            "seconds": round(time.monotonic() - began),
        }

    def list_shards(self) -> list[dict[str, Any]]:
        shards: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"StreamName": self.stream}
        while True:
            page = self.kin.list_shards(**kwargs)
            shards += page["Shards"]
            token = page.get("NextToken")
            if not token or len(shards) >= self.config.shards:
                return shards
            kwargs = {"NextToken": token}

    def drained(self) -> bool:
        assert self.producer is not None
        self.log.poll()
        handled = {row[2] for row in self.log.rows}
        return all(rid in handled for rid in self.producer.written)

    # -- phase 1: start-up

    def startup(self) -> None:
        config = self.config
        phase = self.begin("startup", f"start-up: {config.workers} workers started at once")
        t0 = phase.started
        for _ in range(config.workers):
            self.start_worker()
        everyone = set(self.shard_ids)
        processing_at = held_at = balanced_at = None
        deadline = time.monotonic() + config.settle_time
        owners: Counter[str] = Counter()
        while time.monotonic() < deadline:
            self.log.poll()
            now = time.time()
            if processing_at is None and everyone <= self.log.first.keys():
                processing_at = now
            owners = self.owners()
            owned = sum(count for owner, count in owners.items() if owner is not None)
            if held_at is None and owned >= config.shards:
                held_at = now
            if held_at is not None and self.spread(owners) <= 1:
                balanced_at = now
            if processing_at is not None and balanced_at is not None:
                break
            time.sleep(0.5)
        first = {shard: self.log.first.get(shard) for shard in self.shard_ids}
        spread = self.spread(owners)
        phase.figures = {
            "all_processing": round(processing_at - t0, 2) if processing_at else None,
            "all_held": round(held_at - t0, 2) if held_at else None,
            "balanced": round(balanced_at - t0, 2) if balanced_at else None,
            "leases_per_worker": {name: owners.get(name, 0) for name in self.live},
            "spread": spread,
            "first_record_median": round(
                statistics.median(at - t0 for at in first.values() if at is not None), 2
            )
            if any(at is not None for at in first.values())
            else None,
        }
        for shard, at in first.items():
            phase.per_shard[shard] = {"first_record": round(at - t0, 2) if at else None}
        phase.goals = {"balance within 1 lease": spread <= 1}
        done = processing_at is not None
        # The steady window: is the local stack keeping up with this many shards?
        steady_from = time.time()
        self.mark()
        time.sleep(config.steady)
        self.log.poll()
        steady_to = time.time()
        window = self.window(steady_from, steady_to)
        load = self.load(steady_from, steady_to)
        assert self.producer is not None
        due = config.rate * config.shards * (steady_to - steady_from)
        written = sum(1 for _, sent in self.producer.written.values() if sent >= steady_from)
        phase.figures["steady"] = {
            "seconds": round(steady_to - steady_from, 1),
            "delay_p99": window["delay_p99"],
            "delay_max": window["delay_max"],
            "gap_max": window["gap_max"],
            "written": written,
            "due": round(due),
            "shards_processing": window["shards_processing"],
        }
        phase.load = load
        reasons = []
        if not done:
            missing = len(everyone - self.log.first.keys())
            reasons.append(
                f"start-up did not complete within {config.settle_time:g} s "
                f"({missing} shards never processed)"
            )
        if window["delay_p99"] is None or window["delay_p99"] > SUSTAINED_DELAY_P99:
            reasons.append(
                f"record delay p99 {window['delay_p99']} s > {SUSTAINED_DELAY_P99:g} s in the "
                "steady window"
            )
        if written < 0.9 * due:
            reasons.append(f"the producer wrote {written} of {round(due)} records due")
        if window["shards_processing"] < config.shards:
            reasons.append(
                f"only {window['shards_processing']} of {config.shards} shards had a record "
                "handled in the steady window"
            )
        if reasons and self.fall_back:
            raise Saturated(
                {
                    "shards": config.shards,
                    "reason": "; ".join(reasons),
                    "startup": phase.figures,
                    "load": load,
                }
            )
        phase.figures["not_sustained"] = "; ".join(reasons) or None
        self.end(phase)

    # -- phase 2: rolling restart

    def rolling(self) -> None:
        phase = self.begin(
            "rolling",
            f"rolling restart of all {len(self.live)} workers, one at a time",
        )
        steps = []
        for old in list(self.live):
            step_began = time.time()
            new = self.start_worker()

            ready: list[str] = []

            def arrived(new: str = new, ready: list[str] = ready) -> bool:
                # Up: it holds a lease or asked for one, or its consumer has started (the first
                # take cycle is done: a joiner that finds every worker at the target,
                # ceil(leases / workers), asks for nothing and waits for a leaver's handoff).
                if self.holds_or_asks(new):
                    ready.append("holds or asks")
                elif self.consumer_started(new):
                    ready.append("started, asked for nothing")
                return bool(ready)

            joined = wait_for(arrived, 30, every=0.2)
            joined_after = time.time() - step_began
            exit_seconds = self.stop_worker(old)
            steps.append(
                {
                    "old": old,
                    "new": new,
                    "new_ready": round(joined_after, 2) if joined else None,
                    "new_ready_by": ready[0] if ready else "timed out",
                    "old_exit": round(exit_seconds, 2),
                }
            )
            self.say(
                f"  {old} -> {new}: {new} {ready[0] if ready else 'not up (timed out)'} after "
                f"{joined_after:.2f} s, {old} exited {exit_seconds:.2f} s after SIGTERM"
            )
        time.sleep(self.config.observe)
        phase.figures["steps"] = steps
        self.planned(phase)

    # -- phase 3: scale-out and in

    def scale_out(self) -> None:
        n = len(self.live)
        phase = self.begin("scale_out", f"scale-out {n} -> {n + 2}")
        for _ in range(2):
            self.start_worker()
        balanced = self.wait_balanced(phase)
        time.sleep(self.config.observe)
        phase.figures["balanced"] = balanced
        self.planned(phase)

    def scale_in(self) -> None:
        n = len(self.live)
        phase = self.begin("scale_in", f"scale-in {n} -> {n - 2} (the 2 newest, SIGTERM at once)")
        leaving = self.live[-2:]
        began = time.monotonic()
        for name in leaving:
            self.workers[name].process.send_signal(signal.SIGTERM)
        for name in leaving:
            self.live.remove(name)
        exits = []
        for name in leaving:
            try:
                self.workers[name].process.wait(60)
            except subprocess.TimeoutExpired:
                self.workers[name].process.kill()
                self.workers[name].process.wait(10)
            exits.append(round(time.monotonic() - began, 2))
        phase.figures["exits"] = exits
        phase.figures["balanced"] = self.wait_balanced(phase)
        time.sleep(self.config.observe)
        self.planned(phase)

    def wait_balanced(self, phase: Phase) -> float | None:
        """Seconds until the live workers' leases are within 1 of each other, or (None) until
        every lease is held and the split has not changed for a take cycle + 2 s (the
        coordinator's target is ceil(leases / workers): it may settle at a wider spread)."""
        deadline = time.monotonic() + 30.0 + TAKE_EVERY * 2
        last: dict[str, int] = {}
        changed = time.monotonic()
        balanced_at = None
        while time.monotonic() < deadline:
            owners = self.owners()
            split = {name: owners.get(name, 0) for name in self.live}
            if split != last:
                last, changed = split, time.monotonic()
            if self.spread(owners) <= 1:
                balanced_at = time.time()
                break
            held = sum(split.values()) >= self.config.shards
            if held and time.monotonic() - changed >= TAKE_EVERY + 2.0:
                break
            time.sleep(0.5)
        phase.figures["leases_per_worker"] = last
        phase.figures["spread"] = self.spread(Counter(last))
        phase.figures["settled"] = round(time.time() - phase.started, 2)
        return round(balanced_at - phase.started, 2) if balanced_at else None

    # -- phase 4: idle minute

    def idle(self) -> None:
        assert self.producer is not None
        phase = self.begin(
            "idle", f"idle {self.config.idle:g} s ({len(self.live)} workers, no records)"
        )
        self.producer.pause()
        drained = wait_for(self.drained, 30, every=0.5)
        time.sleep(2.0)
        start = time.time()
        before = self.counts_now()
        time.sleep(self.config.idle)
        end = time.time()
        after = self.counts_now()
        minutes = (end - start) / 60
        per_op: Counter[str] = Counter()
        per_worker: dict[str, dict[str, Any]] = {}
        cpu, _ = self.sampler.cpu_between(start, end)
        rss = self.sampler.rss_at(end)
        for name in self.live:
            calls = diff_calls(before.get(name), after.get(name))
            lease_calls = {
                op: n for op, n in calls.items() if op.split(".", 1)[0] in LEASE_SERVICES and n
            }
            per_op.update(lease_calls)
            per_worker[name] = {
                "cpu": round(cpu.get(name, 0.0), 4),
                "rss_mb": round(rss.get(name, 0) / 2**20, 1),
                "lease_requests_per_minute": round(sum(lease_calls.values()) / minutes, 1),
                "kinesis_requests_per_minute": round(
                    sum(n for op, n in calls.items() if op.startswith("kinesis.")) / minutes, 1
                ),
            }
        phase.figures = {
            "seconds": round(end - start, 1),
            "drained_first": drained,
            "table": self.table_entities(),
            "lease_requests_per_minute": {
                op: round(n / minutes, 1) for op, n in sorted(per_op.items())
            },
            "lease_requests_per_minute_total": round(sum(per_op.values()) / minutes, 1),
            "per_worker": per_worker,
            "cpu_per_worker_max": max((w["cpu"] for w in per_worker.values()), default=0.0),
            "rss_mb_per_worker_max": max((w["rss_mb"] for w in per_worker.values()), default=0.0),
        }
        phase.load = self.load(start, end)
        phase.ended = end
        self.end(phase)
        self.producer.resume()
        # Back to steady before the next phase: every shard handles a record again.
        resumed = time.time()

        def flowing() -> bool:
            self.log.poll()
            return all(self.log.last.get(s, (0.0, ""))[0] > resumed for s in self.shard_ids)

        wait_for(flowing, 30, every=0.5)
        time.sleep(2.0)

    # -- phase 5: kill -9

    def kill(self) -> None:
        owners = self.owners()
        victim = max(self.live, key=lambda name: owners.get(name, 0))
        held = [
            item["leaseKey"]["S"]
            for item in self.leases()
            if item.get("leaseOwner", {}).get("S") == victim
        ]
        phase = self.begin(
            "kill", f"kill -9 of {victim} ({len(held)} leases; workers left: {len(self.live) - 1})"
        )
        killed_at = time.time()
        self.stop_worker(victim, kill=True)

        def taken_over() -> bool:
            self.log.poll()
            return all(
                self.log.last.get(shard, (0.0, ""))[0] > killed_at
                and self.log.last[shard][1] != victim
                for shard in held
            )

        wait_for(taken_over, FAILOVER + 30, every=0.2)
        time.sleep(self.config.observe)
        self.log.poll()
        firsts: dict[str, float | None] = {}
        for shard in held:
            later = [
                at
                for worker, s, _, at in self.log.rows
                if s == shard and at > killed_at and worker != victim
            ]
            firsts[shard] = round(min(later) - killed_at, 3) if later else None
        taken = [v for v in firsts.values() if v is not None]
        readers = self.readers_started(set(held), killed_at)
        after_reader = [
            firsts[shard] - readers[shard]  # type: ignore[operator]
            for shard in held
            if firsts[shard] is not None and shard in readers
        ]
        phase.figures = {
            "victim": victim,
            "leases": len(held),
            "takeover_max": max(taken) if len(taken) == len(held) and taken else None,
            "takeover_median": round(statistics.median(taken), 3) if taken else None,
            "not_taken_over": len(held) - len(taken),
            # From the workers' logs: when the new owner's reader started (lease taken).
            "reader_started_max": round(max(readers.values()), 3) if readers else None,
            "reader_started_min": round(min(readers.values()), 3) if readers else None,
            "first_record_after_reader_max": round(max(after_reader), 3) if after_reader else None,
            "first_record_after_reader_min": round(min(after_reader), 3) if after_reader else None,
        }
        phase.judged = "kill"
        phase.ended = time.time()
        for shard, value in firsts.items():
            phase.per_shard.setdefault(shard, {})["takeover"] = value
            if shard in readers:
                phase.per_shard[shard]["reader_started"] = round(readers[shard], 3)
        worst = phase.figures["takeover_max"]
        phase.goals = {
            f"takeover <= failover + {TAKEOVER_SLACK:g} s for every shard": worst is not None
            and worst <= FAILOVER + TAKEOVER_SLACK
        }
        self.end(phase)

    # -- analysis

    def begin(self, name: str, title: str) -> Phase:
        self.say(f"phase {name}: {title} ...")
        phase = Phase(name, title, started=time.time())
        self.mark()
        return phase

    def end(self, phase: Phase) -> None:
        if not phase.ended:
            phase.ended = time.time()
        if not phase.load:
            phase.load = self.load(phase.started, phase.ended)
        self.phases.append(phase)
        if phase.judged:
            self.say(f"  done after {phase.ended - phase.started:.1f} s")
        else:
            self.say(f"  {summary_line(asdict(phase))}")

    def planned(self, phase: Phase) -> None:
        """A planned move: judged against the goals once the run is drained (:meth:`judge`)."""
        phase.judged = "planned"
        phase.ended = time.time()
        self.end(phase)

    def judge(self) -> None:
        """Gaps, delays, repeats and losses of each phase, with everything handled read."""
        self.log.poll()
        logs = {name: self.dir / f"{name}.log" for name in self.workers}
        assert self.producer is not None
        sent_at = {rid: sent for rid, (_, sent) in self.producer.written.items()}
        for phase in self.phases:
            if not phase.judged:
                continue
            self.window_into(phase)
            f = phase.figures
            if phase.judged == "planned":
                phase.goals = planned_goals(f)
                # Where the pause of each shard that changed hands went, step by step; pauses
                # of shards that did not move: the producer's, a late worker's, or ours.
                f.update(
                    fleet_timeline.explain(
                        self.log.rows,
                        logs,
                        phase.started,
                        phase.ended,
                        sent_at,
                        self.producer.put_log,
                        fleet_timeline.stay_pause(self.config.rate),
                    )
                )
            self.say(f"{phase.name}: {summary_line(asdict(phase))}")
            for key in ("gap_max", "delay_max", "twice", "takeover"):
                self.say(f"  worst shards by {key}: {worst_shards(asdict(phase), key)}")
            if "handoffs" in f:
                for line in fleet_timeline.describe(f["handoffs"]):
                    self.say(f"  handoffs: {line}")
            if "stays" in f:
                longer = f["stays"]["longer_than"]
                for line in fleet_timeline.describe_stays(f["stays"], longer):
                    self.say(f"  stayed: {line}")

    def window_into(self, phase: Phase) -> None:
        got = self.window(phase.started, phase.ended)
        phase.figures.update({k: v for k, v in got.items() if k != "per_shard"})
        for shard, values in got["per_shard"].items():
            phase.per_shard.setdefault(shard, {}).update(values)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Per shard, between two wall times: gaps (from the last record before ``start``),
        delays, records handled a second time, records written and never handled."""
        assert self.producer is not None
        written = dict(self.producer.written)
        by_shard: dict[str, list[float]] = defaultdict(list)
        delays: dict[str, list[float]] = defaultdict(list)
        seen: Counter[str] = Counter()
        twice: Counter[str] = Counter()
        before: dict[str, float] = {}
        for _, shard, rid, at in sorted(self.log.rows, key=lambda row: row[3]):
            seen[rid] += 1
            if at < start:
                before[shard] = at
                continue
            if at > end:
                continue
            by_shard[shard].append(at)
            if rid in written:
                delays[shard].append(at - written[rid][1])
            if seen[rid] > 1:
                twice[shard] += 1
        lost: Counter[str] = Counter(
            shard
            for rid, (shard, sent) in written.items()
            if start <= sent <= end and rid not in seen
        )
        per_shard: dict[str, dict[str, Any]] = {}
        all_gaps_p99: list[float] = []
        all_delays: list[float] = []
        gap_max = 0.0
        for shard in self.shard_ids:
            times = by_shard.get(shard, [])
            points = ([before[shard]] if shard in before else []) + times
            gaps = [b - a for a, b in itertools.pairwise(points)]
            if points and end - points[-1] > 1.0:
                gaps.append(end - points[-1])  # a shard silent at the window's end
            shard_delays = delays.get(shard, [])
            all_delays += shard_delays
            longest = round(max(gaps, default=0.0), 3)
            entry: dict[str, Any] = {
                "gap_max": longest,
                "gap_p99": round(percentile(gaps, 0.99), 3) if gaps else None,
                "delay_p99": round(percentile(shard_delays, 0.99), 3) if shard_delays else None,
                "delay_max": round(max(shard_delays), 3) if shard_delays else None,
                "twice": twice[shard],
                "lost": lost[shard],
            }
            if entry["gap_p99"] is not None:
                all_gaps_p99.append(entry["gap_p99"])
            gap_max = max(gap_max, longest)
            per_shard[shard] = entry
        return {
            "gap_max": round(gap_max, 3),
            "gap_p99": round(max(all_gaps_p99), 3) if all_gaps_p99 else None,
            "gap_p99_median": round(statistics.median(all_gaps_p99), 3) if all_gaps_p99 else None,
            "delay_p99": round(percentile(all_delays, 0.99), 3) if all_delays else None,
            "delay_max": round(max(all_delays), 3) if all_delays else None,
            "twice": sum(twice.values()),
            "lost": sum(lost.values()),
            "shards_processing": sum(1 for shard in self.shard_ids if by_shard.get(shard)),
            "per_shard": per_shard,
        }

    def load(self, start: float, end: float) -> dict[str, Any]:
        """What the machine, the emulators and the workers did between two wall times."""
        cpu, machine = self.sampler.cpu_between(start, end)
        workers = sum(v for name, v in cpu.items() if name in self.workers)
        ours = sum(cpu.values())
        latency: dict[str, dict[str, Any]] = {}
        calls = diff_buckets(self._counts_at(start), self.counts_now())
        for op, buckets in calls.items():
            n = sum(buckets)
            if n == 0:
                continue
            latency[op] = {
                "per_second": round(n / max(end - start, 1e-6), 1),
                "p50": bucket_percentile(buckets, 0.5),
                "p99": bucket_percentile(buckets, 0.99),
            }
        return {
            "cpu": {
                name: round(v, 3)
                for name, v in cpu.items()
                if name not in self.workers or name in self.live
            },
            "cpu_workers": round(workers, 3),
            "cpu_machine": round(machine, 3),
            "cpu_others": round(max(0.0, machine - ours), 3),
            "requests": latency,
        }

    def mark(self) -> None:
        """Remember the workers' request totals now (a window's start)."""
        self.marks.append((time.time(), self.counts_now()))

    def _counts_at(self, at: float) -> dict[str, dict[str, Any]]:
        """The workers' request totals as last marked at or before ``at`` (+0.5 s)."""
        marks = [m for t, m in self.marks if t <= at + 0.5]
        return marks[-1] if marks else {}

    def verify(self) -> dict[str, Any]:
        assert self.producer is not None
        handled = Counter(row[2] for row in self.log.rows)
        written = self.producer.written
        return {
            "written": len(written),
            "handled_ids": sum(1 for rid in handled if rid in written),
            "twice": sum(1 for rid, n in handled.items() if n > 1),
            "lost": sum(1 for rid in written if rid not in handled),
            "unknown": sum(1 for rid in handled if rid not in written),
        }


def diff_calls(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int]:
    if after is None:
        return {}
    earlier = (before or {}).get("calls", {})
    return {op: n - earlier.get(op, 0) for op, n in after["calls"].items()}


def diff_buckets(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, list[int]]:
    """Latency buckets per operation, summed over the workers, between two readings."""
    total: dict[str, list[int]] = {}
    for name, counts in after.items():
        earlier = before.get(name, {}).get("buckets", {})
        for op, buckets in counts["buckets"].items():
            old = earlier.get(op, [0] * len(buckets))
            into = total.setdefault(op, [0] * len(buckets))
            for i, (a, b) in enumerate(zip(old, buckets, strict=True)):
                into[i] += b - a
    return total


def bucket_percentile(buckets: list[int], fraction: float) -> str:
    """The upper edge of the bucket holding the ``fraction`` percentile, e.g. '<= 20 ms'."""
    total = sum(buckets)
    rank = fraction * total
    running = 0
    for i, n in enumerate(buckets):
        running += n
        if running >= rank and n:
            if i < len(LATENCY_EDGES):
                return f"<= {LATENCY_EDGES[i] * 1000:g} ms"
            return f"> {LATENCY_EDGES[-1]:g} s"
    return "-"


# --- where the emulators saturate -----------------------------------------------------------------

PROBE_THREADS = (1, 4, 16)
PROBE_SECONDS = 6.0


def probe(kinesis: str, dynamodb: str, servers: dict[str, int], say: Any = print) -> dict[str, Any]:
    """Each emulator alone under the fleet's commonest requests, from 1, 4 and 16 threads of
    this process for a few seconds each: GetRecords on an idle shard (kinesalite) and a
    conditional UpdateItem that bumps a lease counter, as a renewal does (the lease server).
    Requests/s, latency p50/p99 and the emulator's CPU at each step."""
    import boto3
    import psutil

    kin = boto3.client("kinesis", endpoint_url=kinesis, region_name=REGION)
    ddb = boto3.client("dynamodb", endpoint_url=dynamodb, region_name=REGION)
    stream = table = f"bench-fleet-probe-{int(time.time() * 1000) % 10**9}"
    kin.create_stream(StreamName=stream, ShardCount=16)
    wait_for(
        lambda: (
            kin.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"][
                "StreamStatus"
            ]
            == "ACTIVE"
        ),
        30,
    )
    shard_ids = [s["ShardId"] for s in kin.list_shards(StreamName=stream)["Shards"]]
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    wait_for(lambda: ddb.describe_table(TableName=table)["Table"]["TableStatus"] == "ACTIVE", 30)
    keys = [f"shardId-{i:012d}" for i in range(256)]
    for key in keys:
        ddb.put_item(
            TableName=table,
            Item={"leaseKey": {"S": key}, "leaseOwner": {"S": "probe"}, "leaseCounter": {"N": "0"}},
        )

    def get_records(client: Any, i: int, state: dict[str, str]) -> None:
        iterator = (
            state.get("iterator")
            or client.get_shard_iterator(
                StreamName=stream, ShardId=shard_ids[i % len(shard_ids)], ShardIteratorType="LATEST"
            )["ShardIterator"]
        )
        state["iterator"] = client.get_records(ShardIterator=iterator, Limit=100)[
            "NextShardIterator"
        ]

    def renew(client: Any, i: int, state: dict[str, str]) -> None:
        client.update_item(
            TableName=table,
            Key={"leaseKey": {"S": keys[i % len(keys)]}},
            UpdateExpression="SET leaseCounter = leaseCounter + :one",
            ConditionExpression="leaseOwner = :me",
            ExpressionAttributeValues={":one": {"N": "1"}, ":me": {"S": "probe"}},
        )

    out: dict[str, Any] = {}
    targets = (
        ("kinesalite", "GetRecords", "kinesis", kinesis, get_records),
        (next(n for n in servers if n != "kinesalite"), "UpdateItem", "dynamodb", dynamodb, renew),
    )
    for server, operation, service, endpoint, call in targets:
        process = psutil.Process(servers[server])
        rows = []
        for threads in PROBE_THREADS:
            latencies: list[list[float]] = [[] for _ in range(threads)]
            halt = threading.Event()
            workers = [
                threading.Thread(
                    target=_probe_loop,
                    args=(service, endpoint, call, n, threads, halt, latencies[n]),
                    daemon=True,
                )
                for n in range(threads)
            ]
            for worker in workers:
                worker.start()
            time.sleep(1.0)  # clients built, connections open
            for lat in latencies:
                lat.clear()
            cpu_before, mine_before = process.cpu_times(), psutil.Process().cpu_times()
            began = time.monotonic()
            time.sleep(PROBE_SECONDS)
            took = time.monotonic() - began
            done = [list(lat) for lat in latencies]
            cpu_after, mine_after = process.cpu_times(), psutil.Process().cpu_times()
            halt.set()
            for worker in workers:
                worker.join(10)
            flat = [x for lat in done for x in lat]
            row = {
                "threads": threads,
                "per_second": round(len(flat) / took),
                "p50_ms": round(percentile(flat, 0.5) * 1000, 1) if flat else None,
                "p99_ms": round(percentile(flat, 0.99) * 1000, 1) if flat else None,
                "server_cpu": round(
                    (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system)
                    / took,
                    2,
                ),
                "client_cpu": round(
                    (mine_after.user + mine_after.system - mine_before.user - mine_before.system)
                    / took,
                    2,
                ),
            }
            rows.append(row)
            say(
                f"  probe {server} {operation}, {threads} threads: {row['per_second']}/s, "
                f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, {server} CPU "
                f"{row['server_cpu']:.2f} cores, the probe's own {row['client_cpu']:.2f}"
            )
        out[f"{server} {operation}"] = rows
    return out


def _probe_loop(
    service: str,
    endpoint: str,
    call: Callable[[Any, int, dict[str, str]], None],
    first: int,
    step: int,
    halt: threading.Event,
    latencies: list[float],
) -> None:
    """One probe thread: ``call`` back to back until ``halt``, each call's seconds kept."""
    import boto3

    client = boto3.client(service, endpoint_url=endpoint, region_name=REGION)
    state: dict[str, str] = {}
    i = first
    while not halt.is_set():
        began = time.monotonic()
        call(client, i, state)
        latencies.append(time.monotonic() - began)
        i += step


def probe_line(name: str, rows: list[dict[str, Any]]) -> str:
    best = max(rows, key=lambda r: r["per_second"])
    steps = ", ".join(
        f"{r['threads']} threads {r['per_second']}/s (p99 {r['p99_ms']} ms, "
        f"{r['server_cpu']:.2f} cores)"
        for r in rows
    )
    return f"{name}: at most {best['per_second']}/s seen ({steps})"


# --- the report ---------------------------------------------------------------------------------


def summary_line(phase: dict[str, Any]) -> str:
    f = phase["figures"]
    name = phase["name"]
    if name in ("startup", "idle"):
        return other_figures(phase)
    parts = [
        f"worst gap {fmt_s(f.get('gap_max'))}",
        f"gap p99 {fmt_s(f.get('gap_p99'))} (median shard {fmt_s(f.get('gap_p99_median'))})",
        f"delay p99 {fmt_s(f.get('delay_p99'))}, max {fmt_s(f.get('delay_max'))}",
        f"{f.get('twice')} twice, {f.get('lost')} lost",
    ]
    if name == "kill":
        parts.insert(
            0,
            f"takeover slowest shard {fmt_s(f['takeover_max'])}, median "
            f"{fmt_s(f['takeover_median'])}, {f['not_taken_over']} not taken over",
        )
    if "balanced" in f:
        if f["balanced"] is not None:
            parts.append(f"balanced (within 1) after {fmt_s(f['balanced'])}")
        else:
            parts.append(
                f"not within 1 lease: settled at spread {f['spread']} "
                f"({split(f['leases_per_worker'])})"
            )
    return "; ".join(parts)


def split(leases_per_worker: dict[str, int]) -> str:
    """Leases per worker, fewest first: '31/32/33'."""
    return "/".join(str(n) for n in sorted(leases_per_worker.values()))


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def worst_shards(phase: dict[str, Any], key: str, n: int = 5) -> str:
    rows = [(v.get(key), shard) for shard, v in phase["per_shard"].items() if v.get(key)]
    rows.sort(reverse=True)
    return ", ".join(f"{shard[-4:]} {value:g}" for value, shard in rows[:n]) or "-"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def runs_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runs of a result by lease mode (a result from before the lease modes is one
    per-lease run, its figures at the top)."""
    runs: dict[str, dict[str, Any]] = result.get("runs") or {"per-lease": result}
    return runs


def phase_title(phase: dict[str, Any], workers_left: int | None = None) -> str:
    """A phase's title without what differs between runs (the name of the killed worker)."""
    if phase["name"] == "kill":
        return "kill -9 of the worker holding the most leases" + (
            f" ({workers_left} left)" if workers_left is not None else ""
        )
    return str(phase["title"])


def goals_text(goals: dict[str, bool]) -> str:
    if not goals:
        return ""
    missed = [goal for goal, ok in goals.items() if not ok]
    if not missed:
        return "goals: all met (" + ", ".join(goals) + ")"
    met = [goal for goal, ok in goals.items() if ok]
    return (
        "goals: "
        + ", ".join(f"{goal} MISSED" for goal in missed)
        + (f" (met: {', '.join(met)})" if met else "")
    )


def phase_cell(phase: dict[str, Any]) -> str:
    """One run's figures of a phase, and its goals, in a table cell."""
    f = phase["figures"]
    parts = []
    if phase["judged"] == "planned":
        parts.append(
            f"worst gap {fmt_s(f['gap_max'])}, p99 gap {fmt_s(f['gap_p99'])} (median shard "
            f"{fmt_s(f['gap_p99_median'])}), record delay p99 {fmt_s(f['delay_p99'])} / max "
            f"{fmt_s(f['delay_max'])}, {f['twice']} twice, {f['lost']} lost"
        )
    other = other_figures(phase)
    if other:
        parts.append(other)
    if phase["judged"] == "kill":
        parts.append(f"{f['twice']} handled twice, {f['lost']} lost")
    goals = goals_text(phase["goals"])
    if goals:
        parts.append(goals)
    return "; ".join(parts)


def render(result: dict[str, Any]) -> str:
    """The runs' table, the lease modes side by side, from the JSON (bench/tables.py puts it
    into docs/benchmarks.md)."""
    runs = runs_of(result)
    modes = list(runs)
    first = runs[modes[0]]
    lines = [
        "| phase | " + " | ".join(f"lease mode {mode}" for mode in modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    by_mode = {mode: {p["name"]: p for p in run["phases"]} for mode, run in runs.items()}
    for phase in first["phases"]:
        cells = [
            phase_cell(by_mode[mode][phase["name"]]) if phase["name"] in by_mode[mode] else "-"
            for mode in modes
        ]
        left = first["workers"] - 1 if phase["name"] == "kill" else None
        lines.append(f"| {phase_title(phase, left)} | {' | '.join(cells)} |")
    notes = []
    for mode, run in runs.items():
        for attempt in run.get("saturated", []):
            notes.append(
                f"{mode}: {attempt['shards']} shards NOT sustained ({attempt['reason']}); "
                f"{load_line(attempt['load'])}"
            )
    for mode, run in runs.items():
        startup = next((p for p in run["phases"] if p["name"] == "startup"), None)
        if startup is not None:
            notes.append(
                f"{mode}: {run['shards']} shards, steady load: {load_line(startup['load'])}"
            )
        rolling = next((p for p in run["phases"] if p["name"] == "rolling"), None)
        if rolling is not None:
            notes.append(f"{mode}: load during the rolling restart: {load_line(rolling['load'])}")
            if rolling["figures"].get("handoffs"):
                notes.append(
                    f"{mode}: where the rolling restart's pauses went (workers' logs): "
                    + fleet_timeline.handoff_line(rolling["figures"]["handoffs"])
                )
            if rolling["figures"].get("stays"):
                notes.append(
                    f"{mode}: pauses of shards that did not move in the rolling restart: "
                    + fleet_timeline.describe_stays(
                        rolling["figures"]["stays"],
                        rolling["figures"]["stays"].get("longer_than", STAY_PAUSE),
                    )[0]
                )
        v = run["verified"]
        notes.append(
            f"{mode}: every record id checked: {v['written']:,} written, "
            f"{v['handled_ids']:,} handled, {v['twice']} handled twice in all (kill -9 "
            f"included), {v['lost']} never handled"
        )
    notes += rounds_notes(result)
    for name, rows in result.get("probe", {}).items():
        notes.append(f"probe, {probe_line(name, rows)}")
    startup = next((p for p in first["phases"] if p["name"] == "startup"), None)
    if startup is not None and result.get("probe"):
        asked = startup["load"]["requests"].get("kinesis.GetRecords", {}).get("per_second")
        if asked:
            per_shard = asked / first["shards"]
            notes.append(
                f"the fleet asked kinesalite for {per_shard:.1f} GetRecords/s per shard in the "
                f"steady window: {per_shard * result['requested_shards']:,.0f}/s at "
                f"{result['requested_shards']} shards"
            )
    if any(run.get("saturated") for run in runs.values()):
        notes.append(
            f"run at {first['shards']} shards, below the {result['requested_shards']} asked "
            "for: the local stack did not keep up with more on this machine as it was loaded "
            "during the run (the CPU other jobs took is in each load line)"
        )
    settings = first.get("settings") or result["settings"]
    return "\n".join(
        [
            *lines,
            "",
            *(f"- {note}" for note in notes),
            "",
            f"({settings}; lease modes {', '.join(modes)}, each on fresh emulators; "
            f"{result['machine']}; {result['seconds']} s in all)",
        ]
    )


def render_idle(result: dict[str, Any]) -> str:
    """The idle fleet's lease-table requests in each lease mode (docs/guides/operations.md)."""
    runs = runs_of(result)
    lines = [
        "| lease mode | lease-table requests / minute, all workers | by operation | per worker "
        "| CPU per worker (max) | RSS per worker (max) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    updates: dict[str, float] = {}
    workers = None
    for mode, run in runs.items():
        idle = next((p for p in run["phases"] if p["name"] == "idle"), None)
        if idle is None:
            continue
        f = idle["figures"]
        per_op = f["lease_requests_per_minute"]
        updates[mode] = per_op.get("dynamodb.UpdateItem", 0.0)
        workers = len(f["per_worker"])
        per_worker = f["lease_requests_per_minute_total"] / max(workers, 1)
        ops = ", ".join(f"{op.split('.', 1)[1]} {n:,.0f}" for op, n in per_op.items())
        lines.append(
            f"| {mode} | {f['lease_requests_per_minute_total']:,.0f} | {ops or '-'} "
            f"| {per_worker:,.0f} | {f['cpu_per_worker_max']:.3f} | "
            f"{f['rss_mb_per_worker_max']:.0f} MB |"
        )
    first = next(iter(runs.values()))
    notes = [
        f"An idle fleet of {workers} worker processes on {first['shards']} shards, "
        f"{next(p for p in first['phases'] if p['name'] == 'idle')['figures']['seconds']:g} s "
        "measured, no records flowing; requests counted in each worker (botocore hooks)."
    ]
    if "per-lease" in updates and "heartbeat" in updates and updates["per-lease"]:
        notes.append(
            f"Lease writes (UpdateItem) in the heartbeat mode: "
            f"{updates['heartbeat'] / updates['per-lease']:.3f}x the per-lease mode's, same run."
        )
    settings = first.get("settings") or result["settings"]
    notes.append(f"`bench/fleet.py`: {settings}; {result['machine']}.")
    return "\n".join([*lines, "", " ".join(notes)])


def goal_lines(result: dict[str, Any]) -> list[str]:
    """Every goal of every phase, per lease mode, met or MISSED."""
    lines = []
    for mode, run in runs_of(result).items():
        goals = [
            f"{phase['name']}: {goal} {verdict(ok)}"
            for phase in run["phases"]
            for goal, ok in phase["goals"].items()
        ]
        lines.append(f"goals, lease mode {mode}: " + "; ".join(goals))
    return lines


def other_figures(phase: dict[str, Any]) -> str:
    """What a phase measures besides gaps and repeats, in a table cell."""
    f = phase["figures"]
    name = phase["name"]
    if name == "startup":
        s = f.get("steady", {})
        return (
            f"all held after {fmt_s(f['all_held'])}, all processing {fmt_s(f['all_processing'])}, "
            f"balanced {fmt_s(f['balanced'])}; leases per worker "
            f"{split(f['leases_per_worker'])} (spread {f['spread']}); then "
            f"{s.get('seconds')} s steady: record delay p99 {fmt_s(s.get('delay_p99'))}"
            + (f"; NOT sustained: {f['not_sustained']}" if f.get("not_sustained") else "")
        )
    if name == "idle":
        ops = ", ".join(f"{op} {n:g}" for op, n in f["lease_requests_per_minute"].items())
        return (
            f"lease-table requests per minute, all workers: {ops or 'none'} "
            f"({f['lease_requests_per_minute_total']:g} in all); per worker CPU up to "
            f"{f['cpu_per_worker_max']:.3f} of a core, RSS up to {f['rss_mb_per_worker_max']:.0f} MB"
        )
    if name == "kill":
        readers = ""
        if f.get("reader_started_max") is not None:
            readers = (
                f"; the new owners' readers started {f['reader_started_min']:.2f} to "
                f"{f['reader_started_max']:.2f} s after the kill (lease expired and taken), "
                f"their first records were handled {f['first_record_after_reader_min']:.2f} to "
                f"{f['first_record_after_reader_max']:.2f} s after that"
            )
        return (
            f"takeover: slowest shard {fmt_s(f['takeover_max'])}, median "
            f"{fmt_s(f['takeover_median'])}, {f['not_taken_over']} shards not taken over" + readers
        )
    if name == "rolling":
        steps = f.get("steps", [])
        ready = [s["new_ready"] for s in steps if s.get("new_ready") is not None]
        exits = [s["old_exit"] for s in steps]
        return (
            f"{len(steps)} steps; replacement up after {fmt_s(max(ready, default=None))} at "
            f"most, old worker gone {fmt_s(max(exits, default=None))} after SIGTERM at most"
        )
    if "balanced" in f:
        if f["balanced"] is not None:
            return f"balanced (within 1 lease) after {fmt_s(f['balanced'])}"
        return (
            f"not within 1 lease: settled at {split(f['leases_per_worker'])} "
            f"(spread {f['spread']}) after {fmt_s(f.get('settled'))}"
        )
    return ""


def load_line(load: dict[str, Any]) -> str:
    cpu = load["cpu"]
    servers = ", ".join(
        f"{name} {cpu[name]:.2f}" for name in ("kinesalite", "dynalite", "moto") if name in cpu
    )
    requests = load["requests"]
    ops = ", ".join(
        f"{op} {requests[op]['per_second']:g}/s p50 {requests[op]['p50']} p99 {requests[op]['p99']}"
        for op in ("kinesis.GetRecords", "dynamodb.UpdateItem", "dynamodb.Scan")
        if op in requests
    )
    return (
        f"CPU (cores) {servers}, workers {load['cpu_workers']:.2f}, machine "
        f"{load['cpu_machine']:.2f} of {os.cpu_count()} (others {load['cpu_others']:.2f}); {ops}"
    )


def settings_line(config: Config, shards: int) -> str:
    return (
        f"{shards} shards x {config.rate:g} records/s, {config.workers} workers, lease table on "
        f"{config.lease_server} (pick-up "
        f"{'DynamoDB stream' if config.lease_server == 'moto' else 'polled'} every "
        f"{PICKUP_INTERVAL:g} s), Kinesis on kinesalite; failover {FAILOVER:g} s, take cycle "
        f"{TAKE_EVERY:.2f} s, handoff timeout {HANDOFF_TIMEOUT:g} s, successor wait "
        f"{SUCCESSOR_WAIT:g} s, drain timeout "
        f"{DRAIN_TIMEOUT:g} s, polling idle {IDLE_TIME:g} s; observed {config.observe:g} s "
        f"after each action, idle {config.idle:g} s"
    )


def run(config: Config, say: Any = print) -> dict[str, Any]:
    """The whole bench, on emulators of its own, once per lease mode of ``config``; the
    result as written to JSON (the runs side by side under ``runs``, keyed by mode)."""
    from shardflow.local import DynaliteServer, KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    started = time.monotonic()
    say(f"settings: {settings_line(config, config.shards)}")
    probed: dict[str, Any] = {}
    if config.probe:
        say("probe: each emulator alone under the fleet's commonest request ...")
        lease_server = DynaliteServer() if config.lease_server == "dynalite" else MotoServer()
        with KinesaliteServer() as kinesalite, lease_server as leases:
            servers = {"kinesalite": kinesalite.pid, config.lease_server: leases.pid}
            probed = probe(kinesalite.endpoint_url, leases.endpoint_url, servers, say)
    runs: dict[str, dict[str, Any]] = {}
    attempt = config
    for mode in config.lease_modes:
        say(f"lease mode {mode}, {attempt.shards} shards ...")
        # The first mode finds the shard count the local stack sustains; the next run at that
        # count (no fallback) so that the modes compare on the same fleet.
        outcome, attempt = run_mode(replace(attempt, lease_mode=mode), say)
        attempt = replace(attempt, fallback=False)
        runs[mode] = outcome
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    first = runs[config.lease_modes[0]]
    result = {
        "benchmark": "fleet",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": machine,
        "settings": settings_line(attempt, attempt.shards),
        "requested_shards": config.shards,
        "shards": first["shards"],
        "workers": config.workers,
        "lease_server": config.lease_server,
        "lease_modes": list(config.lease_modes),
        "probe": probed,
        "runs": runs,
        "seconds": round(time.monotonic() - started),
    }
    for line in goal_lines(result):
        say(line)
    return result


def run_mode(config: Config, say: Any) -> tuple[dict[str, Any], Config]:
    """One fleet run in ``config.lease_mode``, starting over at half the shards while the
    local stack does not keep up (if ``config.fallback``); the run and the config it ran."""
    from shardflow.local import DynaliteServer, KinesaliteServer, MotoServer

    saturated: list[dict[str, Any]] = []
    attempt = config
    while True:
        smaller = max(attempt.shards // 2, config.min_shards)
        fall_back = config.fallback and smaller < attempt.shards
        lease_server = DynaliteServer() if config.lease_server == "dynalite" else MotoServer()
        # Fresh emulators for each attempt: a saturated attempt leaves nothing behind.
        with KinesaliteServer(shard_limit=2000) as kinesalite, lease_server as leases:
            servers = {"kinesalite": kinesalite.pid, config.lease_server: leases.pid}
            fleet = Fleet(
                attempt,
                kinesalite.endpoint_url,
                leases.endpoint_url,
                servers,
                say,
                fall_back=fall_back,
            )
            try:
                outcome = fleet.run()
                break
            except Saturated as too_many:
                saturated.append(too_many.attempt)
                say(
                    f"{attempt.shards} shards NOT sustained: {too_many.attempt['reason']}; "
                    f"{load_line(too_many.attempt['load'])}"
                )
                say(f"starting over at {smaller} shards")
                attempt = replace(attempt, shards=smaller)
    outcome["saturated"] = saturated
    outcome["settings"] = settings_line(attempt, attempt.shards)
    return outcome, attempt


PHASE_MEDIANS = (
    "gap_max",
    "gap_p99",
    "gap_p99_median",
    "delay_p99",
    "delay_max",
    "takeover_max",
    "takeover_median",
    "all_held",
    "all_processing",
    "balanced",
)
"""Figures of a phase that a run of several rounds gives as the median over the rounds."""


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from rounds of the same bench (``--repeat``): per lease mode and phase, the
    median of each time (:data:`PHASE_MEDIANS`), records twice and lost summed over the rounds
    (any is one too many), a planned move's goals judged on those, every other goal met only
    if met in every round; the per-shard figures, step-by-step pauses and load of the round
    whose worst gap is the median; each round's own figures under the phase's ``rounds``."""
    if len(results) == 1:
        return results[0]
    combined = copy.deepcopy(results[0])
    for mode, run in runs_of(combined).items():
        rounds = [runs_of(r)[mode] for r in results if mode in runs_of(r)]
        for index, phase in enumerate(run["phases"]):
            same = [p for r in rounds for p in r["phases"] if p["name"] == phase["name"]]
            ranked = sorted(same, key=lambda p: p["figures"].get("gap_max") or 0.0)
            middle = copy.deepcopy(ranked[(len(ranked) - 1) // 2])
            f = middle["figures"]
            for key in PHASE_MEDIANS:
                values = [p["figures"][key] for p in same if p["figures"].get(key) is not None]
                if key in f and values:
                    f[key] = round(statistics.median(values), 3)
            for key in ("twice", "lost"):
                if key in f:
                    f[key] = sum(p["figures"].get(key, 0) for p in same)
            if middle["judged"] == "planned":
                middle["goals"] = planned_goals(f)
            else:
                middle["goals"] = {
                    goal: all(p["goals"].get(goal, False) for p in same) for goal in f_goals(same)
                }
            middle["rounds"] = [
                {key: p["figures"].get(key) for key in ("gap_max", "delay_p99", "twice", "lost")}
                | (
                    {"takeover_max": p["figures"]["takeover_max"]}
                    if "takeover_max" in p["figures"]
                    else {}
                )
                for p in same
            ]
            run["phases"][index] = middle
        run["verified"] = {
            key: sum(r["verified"].get(key, 0) for r in rounds)
            for key in ("written", "handled_ids", "twice", "lost", "unknown")
        }
        run["saturated"] = [a for r in rounds for a in r.get("saturated", [])]
    combined["repeat"] = len(results)
    combined["seconds"] = sum(r["seconds"] for r in results)
    return combined


def merge_modes(earlier: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with the runs of ``earlier`` (the results file as it was) for lease modes it
    did not run, in :data:`LEASE_MODES` order: the two modes measured one after the other, each
    in a run of its own. Each run keeps its own settings; the top-level figures are this run's,
    with the earlier run's time added and its moment kept under ``merged``."""
    runs = {**runs_of(earlier), **runs_of(result)}
    merged = copy.deepcopy(result)
    merged["runs"] = {mode: runs[mode] for mode in LEASE_MODES if mode in runs}
    merged["lease_modes"] = list(merged["runs"])
    kept = [mode for mode in runs_of(earlier) if mode not in runs_of(result)]
    if kept:
        merged["seconds"] = result["seconds"] + earlier.get("seconds", 0)
        merged["merged"] = [{"when": earlier.get("when"), "lease_modes": kept}]
    return merged


def rounds_notes(result: dict[str, Any]) -> list[str]:
    """For a run of several rounds: what the table's medians are made of."""
    if result.get("repeat", 1) <= 1:
        return []
    notes = [
        f"medians of {result['repeat']} rounds, each on fresh emulators (records twice and "
        "lost: summed over the rounds; per-shard figures and the pauses' steps: the median round)"
    ]
    for mode, run in runs_of(result).items():
        for phase in run["phases"]:
            rounds = phase.get("rounds")
            if not rounds or phase["judged"] != "planned":
                continue
            gaps = " / ".join(fmt_s(r["gap_max"]) for r in rounds)
            delays = " / ".join(fmt_s(r["delay_p99"]) for r in rounds)
            notes.append(
                f"{mode}, {phase['name']}: worst gap per round {gaps}; record delay p99 {delays}"
            )
    return notes


def f_goals(phases: list[dict[str, Any]]) -> list[str]:
    """Every goal named in any of ``phases``, in order."""
    return list(dict.fromkeys(goal for p in phases for goal in p["goals"]))


def planned_goals(f: dict[str, Any]) -> dict[str, bool]:
    """A planned move's goals, judged on its figures."""
    return {
        f"worst gap <= {PLANNED_GAP:g} s": f["gap_max"] <= PLANNED_GAP,
        f"record delay p99 <= {PLANNED_DELAY_P99:g} s": f["delay_p99"] is not None
        and f["delay_p99"] <= PLANNED_DELAY_P99,
        "0 twice": f["twice"] == 0,
        "0 lost": f["lost"] == 0,
    }


def set_lease_mode(endpoint: str, application: str, mode: str, lease_server: str) -> None:
    """Create the application's lease table and store its lease mode in it."""
    import asyncio

    from shardflow.aws.clients import ClientFactory
    from shardflow.aws.settings import AwsSettings
    from shardflow.leases.dynamodb import DynamoDBLeaseStore

    async def store_mode() -> None:
        factory = ClientFactory(AwsSettings(region=REGION, endpoint_url=endpoint))
        async with factory.dynamodb() as client:
            store = DynamoDBLeaseStore(client, application)
            # moto: with the stream that lease pick-up reads, as the workers would create it.
            await store.ensure_table(stream_if_created=lease_server == "moto")
            await store.set_lease_mode("heartbeat" if mode == "heartbeat" else "per-lease")

    asyncio.run(store_mode())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, help=f"default {DEFAULT.shards}")
    parser.add_argument("--workers", type=int, help=f"default {DEFAULT.workers}")
    parser.add_argument("--rate-per-shard", type=float, help=f"default {DEFAULT.rate:g}")
    parser.add_argument(
        "--lease-server",
        choices=("dynalite", "moto"),
        default="dynalite",
        help="the lease table's server: dynalite (concurrent; no stream, so pick-up polls) or "
        "moto (with its DynamoDB stream; serialized, ~110 conditional writes/s)",
    )
    parser.add_argument(
        "--lease-mode",
        choices=(*LEASE_MODES, "both"),
        default="both",
        help="the lease mode of the application (stored in its table before the workers "
        "start): per-lease renewals, one heartbeat per worker, or both, one run after the "
        "other on fresh emulators, side by side in the result (default both)",
    )
    parser.add_argument(
        "--phases",
        help=f"comma-separated, from {','.join(PHASES)} (start-up always runs; default all)",
    )
    parser.add_argument("--observe", type=float, help="seconds observed after each action")
    parser.add_argument("--idle", type=float, help="seconds of the idle phase")
    parser.add_argument("--steady", type=float, help="seconds of the steady window (load check)")
    parser.add_argument("--settle", type=float, help="start-up: seconds to wait at most")
    parser.add_argument("--min-shards", type=int, help="fall back no lower than this (default 64)")
    parser.add_argument(
        "--no-fallback",
        action="store_true",
        help="run at --shards even if the local stack does not keep up (say so)",
    )
    parser.add_argument(
        "--short", action="store_true", help="64 shards, 4 workers, shorter phases (make bench)"
    )
    parser.add_argument(
        "--no-probe", action="store_true", help="skip the emulators' own load probe"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole bench this many times; the result holds the medians (see combine)",
    )
    parser.add_argument(
        "--results-name",
        help="write the result to bench/results/NAME (e.g. fleet-128-moves.json, rendered as "
        "fleet@128-moves) whatever the settings",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other lease mode's run of the results file (one mode per run, e.g. "
        "each under its own hold of the bench lock; see merge_modes)",
    )
    parser.add_argument("--child-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--application", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_worker:
        run_worker(
            worker_id=args.worker_id,
            stream=args.stream,
            application=args.application,
            out=args.out,
            handoff=True,
            lease_server=args.lease_server,
            counts=args.counts,
        )
        return
    stop_on_sigterm()
    modes = LEASE_MODES if args.lease_mode == "both" else (args.lease_mode,)
    config = replace(
        SHORT if args.short else DEFAULT, lease_server=args.lease_server, lease_modes=modes
    )
    overrides: dict[str, Any] = {
        "shards": args.shards,
        "workers": args.workers,
        "rate": args.rate_per_shard,
        "observe": args.observe,
        "idle": args.idle,
        "steady": args.steady,
        "settle": args.settle,
        "min_shards": args.min_shards,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if args.phases:
        config = replace(config, phases=("startup", *args.phases.split(",")))
    if args.no_fallback:
        config = replace(config, fallback=False)
    if args.no_probe:
        config = replace(config, probe=False)

    def say(*parts: Any) -> None:
        print(*parts, flush=True)

    results = []
    for round_no in range(1, args.repeat + 1):
        if args.repeat > 1:
            say(f"round {round_no} of {args.repeat}")
        results.append(run(config, say=say))
    result = combine(results)
    name = args.results_name or "fleet.json"
    if args.merge and (RESULTS / name).exists():
        result = merge_modes(json.loads((RESULTS / name).read_text()), result)
    print("\n" + render(result))
    full = config == DEFAULT
    if os.environ.get("SHARDFLOW_BENCH_RESULTS") or full or args.results_name:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {RESULTS / name}")
    else:
        print(
            "(not written: only the full default run writes bench/results/fleet.json; set "
            "SHARDFLOW_BENCH_RESULTS=DIR to keep this one)"
        )


if __name__ == "__main__":
    main()
