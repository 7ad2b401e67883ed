"""Deploys, scale-out and crashes with real worker processes: gaps, repeats and losses per shard.

Kinesis runs on kinesalite, the lease table on moto's DynamoDB (with its DynamoDB stream), or
on dynalite (``--lease-server dynalite``: many requests at once where moto serves one at a
time; no stream, so pick-up polls). One stream of 8 shards (``--shards``); a producer thread
writes 50 records/s to every shard (``--rate-per-shard``; explicit hash keys), each record
carrying a unique id and its send time. Workers are separate OS processes running
``shardflow``'s Consumer (``Consumer.run``: SIGTERM stops it gracefully); each appends
``worker, shard, record id, processing time`` to a file of its own for every record handled
(one unbuffered write per record, so a kill -9 loses no line of what was handled).

Scenarios, each on a fresh stream and application, starting from 2 workers holding half the
leases each after a warm-up (``--settle`` bounds the wait for that split):

    a) rolling restart: start 2 new workers, wait until they hold or are handed a lease, then
       SIGTERM the 2 old ones (at the same moment);
    b) scale out 2 -> 4: start 2 new workers;
    c) crash: kill -9 one worker;
    d) replace at once: start 2 new workers and SIGTERM the 2 old ones at the same moment
       (each old worker sees only the other as a live peer).

Each scenario runs twice in the same run: with planned handoff and fast pick-up (the lease
table's DynamoDB stream), and as the baseline with both off (KCL 2.x behaviour: release at
shutdown, steal to balance, one take cycle every take interval). Per shard: the longest gap
between two consecutive records handled (by processing time, from 1 s before the action to
the last record handled), records handled more than once, records never handled; per scenario: the p99 of
all gaps between consecutive records in that window, and for (c) the takeover time (kill to
the first record of each of the dead worker's shards handled elsewhere; the slowest shard).
Targets (handoff): planned moves (a, b, d) pause no shard longer than 1 s and handle no
record twice; a crash (c) is taken over within failover + 2 s; nothing is lost.

Lease timings are shorter than KCL's so that a run takes minutes: failover 6 s (renew every
1.975 s, take cycle every 12.05 s: KCL's ratios), polling idle time 0.2 s (KCL 1 s would
itself make 1 s gaps). Checkpoints as the consumer's defaults (every 1,000 records or 5 s).
Results: bench/results/handoff.json for the default run, handoff-<shards>[-dynalite].json
otherwise (rendered into the docs as ``handoff@64`` and so on).

    .venv/bin/python bench/handoff.py                     # all scenarios, both modes (~7 min)
    .venv/bin/python bench/handoff.py --scenarios c --modes handoff
    .venv/bin/python bench/handoff.py --shards 64 --rate-per-shard 5 --modes handoff
    .venv/bin/python bench/handoff.py --shards 64 --rate-per-shard 5 --modes handoff --repeat 3

With ``--repeat N`` every scenario runs N times, each round on fresh emulators; the table gives
the medians (records twice and lost: summed over the rounds) and the notes each round's own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fleet_timeline
from fleet_kit import (
    FAILOVER,
    IDLE_TIME,
    PICKUP_INTERVAL,
    REGION,
    SUCCESSOR_WAIT,
    TAKE_EVERY,
    Producer,
    p99,
    read_handled,
    run_worker,
    stack_clients,
    stack_env,
    stop_on_sigterm,
    wait_for,
)

# make bench (the short mode) writes elsewhere: only full runs are the docs' figures.
RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
SHARDS = 8  # the default of --shards
RATE_PER_SHARD = 50.0  # records per second, the default of --rate-per-shard
WARMUP = 4.0  # seconds of steady processing by the 2 first workers before the action
MODES = ("handoff", "baseline")
SCENARIOS = {
    "a": "rolling restart (2 new, SIGTERM 2 old)",
    "b": "scale out 2 -> 4",
    "c": "kill -9 one of 2",
    "d": "replace at once (2 new, SIGTERM 2 old as they start)",
}


# --- the worker process -------------------------------------------------------------------------


def worker_child(args: argparse.Namespace) -> None:
    run_worker(
        worker_id=args.worker_id,
        stream=args.stream,
        application=args.application,
        out=args.out,
        handoff=args.mode == "handoff",
        lease_server=args.lease_server,
    )


# --- one scenario -------------------------------------------------------------------------------


@dataclass
class Worker:
    name: str
    out: Path
    process: subprocess.Popen[bytes]


@dataclass
class Outcome:
    scenario: str
    mode: str
    per_shard: dict[str, dict[str, float | int]] = field(default_factory=dict)
    gap_p99: float = 0.0
    """The highest of the shards' own p99 gaps (pooled over all shards, one shard's pause
    drowns among every other shard's steady gaps)."""
    gap_p99_median: float = 0.0
    """The median shard's p99 gap."""
    gap_max: float = 0.0
    duplicates: int = 0
    lost: int = 0
    written: int = 0
    takeover: float | None = None
    took: float = 0.0
    handoffs: dict[str, Any] = field(default_factory=dict)
    """Where the pauses of shards that changed hands went (fleet_timeline.stage_summary)."""
    stays: dict[str, Any] = field(default_factory=dict)
    """Pauses of shards that did not move, set against the producer's gaps and the workers'
    loop lateness (fleet_timeline.stay_summary)."""
    rounds: list[dict[str, Any]] = field(default_factory=list)
    """With ``--repeat``: each round's own figures (the others are medians, see combine)."""


class Scenario:
    def __init__(
        self, args: argparse.Namespace, key: str, mode: str, kinesis: str, dynamodb: str
    ) -> None:
        self.args = args
        self.key = key
        self.mode = mode
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.stream = f"bench-handoff-{key}-{mode}-{stamp}"
        self.app = f"bench-handoff-{key}-{mode}-{stamp}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"handoff-{key}-{mode}-"))
        self.workers: dict[str, Worker] = {}
        self.env = stack_env(kinesis, dynamodb)
        self.ddb, self.kin = stack_clients(kinesis, dynamodb)

    def start_worker(self, name: str) -> None:
        out = self.dir / f"{name}.tsv"
        command = [
            sys.executable,
            __file__,
            "--child-worker",
            "--mode",
            self.mode,
            "--lease-server",
            self.args.lease_server,
            "--stream",
            self.stream,
            "--application",
            self.app,
            "--worker-id",
            name,
            "--out",
            str(out),
        ]
        log = (self.dir / f"{name}.log").open("wb")
        process = subprocess.Popen(command, env=self.env, stdout=log, stderr=log)
        self.workers[name] = Worker(name, out, process)

    def owners(self) -> Counter[str]:
        try:
            items = self.ddb.scan(TableName=self.app, ConsistentRead=True)["Items"]
        except self.ddb.exceptions.ResourceNotFoundException:
            return Counter()
        return Counter(item.get("leaseOwner", {}).get("S") for item in items)

    def owned_by(self, name: str) -> list[str]:
        items = self.ddb.scan(TableName=self.app, ConsistentRead=True)["Items"]
        return [
            item["leaseKey"]["S"] for item in items if item.get("leaseOwner", {}).get("S") == name
        ]

    def wait_for(self, condition: Any, within: float) -> bool:
        return wait_for(condition, within)

    def records(self) -> list[tuple[str, str, str, float]]:
        return read_handled(worker.out for worker in self.workers.values())

    def run(self) -> Outcome:
        try:
            return self._run()
        finally:
            for worker in self.workers.values():  # interrupted: leave no worker behind
                if worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait(5)

    def _run(self) -> Outcome:
        began = time.monotonic()
        self.kin.create_stream(StreamName=self.stream, ShardCount=self.args.shards)
        self.wait_for(
            lambda: (
                self.kin.describe_stream_summary(StreamName=self.stream)[
                    "StreamDescriptionSummary"
                ]["StreamStatus"]
                == "ACTIVE"
            ),
            30,
        )
        shards = self.kin.list_shards(StreamName=self.stream)["Shards"]
        producer = Producer(
            self.kinesis,
            self.stream,
            {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards},
            self.args.rate_per_shard,
        )
        producer.start()
        try:
            self.start_worker("w1")
            self.start_worker("w2")
            half = self.args.shards // 2
            balanced = Counter({"w1": half, "w2": self.args.shards - half})
            settle = self.args.settle if self.args.settle is not None else 60.0 + self.args.shards
            if not self.wait_for(lambda: self.owners() == balanced, settle):
                print(f"  ({self.key}/{self.mode}: warm-up split is {dict(self.owners())})")
            time.sleep(WARMUP)
            action_at, takeover_from = self.act()
            time.sleep(self.args.observe)
        finally:
            producer.stop()
        # Everything written must be handled by someone: wait for the tail.
        self.wait_for(lambda: len({r[2] for r in self.records()}) >= len(producer.written), 30)
        self.stop_all()
        outcome = self.analyse(producer, action_at, takeover_from)
        outcome.took = time.monotonic() - began
        with_ids = {"stream": self.stream, "files": str(self.dir)}
        print(f"  {self.key}/{self.mode}: {with_ids}, producer retries {producer.failures}")
        return outcome

    def act(self) -> tuple[float, dict[str, float]]:
        """The scenario's action; its wall time and, for a crash, the dead worker's shards."""
        if self.key in ("a", "b", "d"):
            action_at = time.time()
            self.start_worker("w3")
            self.start_worker("w4")
            if self.key == "a":
                # A deploy starts the new version, waits until it is up, stops the old one.
                self.wait_for(
                    lambda: self.owners().get("w3", 0) + self.owners().get("w4", 0) > 0, 20
                )
            if self.key in ("a", "d"):
                # (d): the old ones are told to stop before the new ones hold or ask for
                # anything: each old worker sees only the other as a live peer.
                for name in ("w1", "w2"):
                    self.workers[name].process.send_signal(signal.SIGTERM)
                for name in ("w1", "w2"):
                    try:
                        self.workers[name].process.wait(30)
                    except subprocess.TimeoutExpired:
                        self.workers[name].process.kill()
            return action_at, {}
        victim = self.owned_by("w1")
        action_at = time.time()
        self.workers["w1"].process.send_signal(signal.SIGKILL)
        self.workers["w1"].process.wait(10)
        return action_at, dict.fromkeys(victim, action_at)

    def stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers.values():
            try:
                worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(5)

    def analyse(self, producer: Producer, action_at: float, victims: dict[str, float]) -> Outcome:
        rows = self.records()
        outcome = Outcome(self.key, self.mode, written=len(producer.written))
        handled = Counter(row[2] for row in rows)
        outcome.duplicates = sum(1 for count in handled.values() if count > 1)
        outcome.lost = sum(1 for rid in producer.written if rid not in handled)
        by_shard: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for worker, shard, _, at in rows:
            by_shard[shard].append((at, worker))
        all_gaps: list[float] = []
        p99s: list[float] = []
        duplicates_by_shard = Counter(
            producer.written[rid][0]
            for rid, count in handled.items()
            if count > 1 and rid in producer.written
        )
        lost_by_shard = Counter(
            shard for rid, (shard, _) in producer.written.items() if rid not in handled
        )
        # The window: from just before the action to the last record handled (a shard taken
        # over after production stopped shows its outage as the gap before its backlog).
        for shard in sorted(by_shard):
            times = sorted(at for at, _ in by_shard[shard] if at >= action_at - 1.0)
            gaps = [b - a for a, b in itertools.pairwise(times)]
            all_gaps += gaps
            if gaps:
                p99s.append(p99(gaps))
            outcome.per_shard[shard] = {
                "p99_gap": round(p99(gaps), 3) if gaps else 0.0,
                "longest_gap": round(max(gaps, default=0.0), 3),
                "duplicates": duplicates_by_shard[shard],
                "lost": lost_by_shard[shard],
            }
        if p99s:
            outcome.gap_p99 = round(max(p99s), 3)
            outcome.gap_p99_median = round(statistics.median(p99s), 3)
            outcome.gap_max = round(max(all_gaps), 3)
        if victims:
            firsts = []
            for shard in victims:
                later = [
                    at
                    for at, worker in by_shard.get(shard, [])
                    if at > action_at and worker != "w1"
                ]
                firsts.append(min(later) - action_at if later else float("inf"))
            outcome.takeover = round(max(firsts), 3) if firsts else None
        # The same window step by step, from the workers' logs (as bench/fleet.py does).
        explained = fleet_timeline.explain(
            rows,
            {name: self.dir / f"{name}.log" for name in self.workers},
            action_at - 1.0,
            max((row[3] for row in rows), default=action_at),
            {rid: sent for rid, (_, sent) in producer.written.items()},
            producer.put_log,
            fleet_timeline.stay_pause(self.args.rate_per_shard),
        )
        outcome.handoffs, outcome.stays = explained["handoffs"], explained["stays"]
        return outcome


# --- what pick-up costs on DynamoDB ----------------------------------------------------------------

# Published on-demand prices, us-east-1, as of the 2024-11-01 price cut (assumptions; the free
# tier and the 2.5 M free stream reads a month are ignored).
PRICE_WRITE = 0.625 / 1e6  # per write request unit (one write of an item up to 1 KB)
PRICE_READ = 0.125 / 1e6  # per read request unit (strongly consistent read, up to 4 KB)
PRICE_STREAM_READ = 0.02 / 1e5  # per DynamoDB Streams read request unit (one GetRecords call)
FLEETS = ((8, 2), (100, 4), (1000, 10))  # (shards, workers)


def scan_units(leases: int, item_bytes: float) -> int:
    """Read units of one consistent Scan of the lease table: sizes summed, per 4 KB."""
    return max(1, -(-int(leases * item_bytes) // 4096))


def costs(item_bytes: float) -> tuple[str, dict[str, Any]]:
    """Dollars per shard-hour of each pick-up mode at KCL's default timings (docs/guides/operations.md#costs)."""
    from shardflow.leases.pickup import SCAN_RATE
    from shardflow.leases.settings import LeaseSettings

    s = LeaseSettings()
    renew = 3600 / s.renew_every * PRICE_WRITE
    checkpoint = 3600 / 5.0 * PRICE_WRITE  # the default checkpoint interval, while records flow
    rows = []
    data: dict[str, Any] = {"item_bytes": item_bytes, "fleets": {}}
    for shards, workers in FLEETS:
        per_shard = workers / shards
        scan = scan_units(shards, item_bytes)
        take = per_shard * 3600 / s.take_every * scan * PRICE_READ
        # A poller scans at most SCAN_RATE leases a second (a large table less often).
        poll_every = max(s.pickup_poll_interval, shards / SCAN_RATE)
        poll = per_shard * 3600 / poll_every * scan * PRICE_READ
        stream = per_shard * 3600 / s.pickup_poll_interval * 1 * PRICE_STREAM_READ
        base = renew + checkpoint + take
        modes = {"off": base, "poll": base + poll, "stream": base + stream}
        data["fleets"][f"{shards}x{workers}"] = modes
        rows.append(
            f"| {shards} shards, {workers} workers | ${renew + checkpoint:.5f} "
            f"| ${base:.5f} | ${modes['stream']:.5f} (+${stream:.6f}) "
            f"| ${modes['poll']:.5f} (+${poll:.6f}) |"
        )
    head = [
        f"DynamoDB $ per shard-hour at KCL timings (renew {s.renew_every:.3f} s, take cycle "
        f"{s.take_every:.2f} s, checkpoint every 5 s, pick-up every {s.pickup_poll_interval:g} s, "
        f"a poll's scan at most {SCAN_RATE:,} leases a second; "
        f"lease item {item_bytes:.0f} B as measured; writes $0.625/M, reads $0.125/M, "
        "stream reads $0.02/100k):",
        "",
        "| fleet | renew + checkpoint writes | off (KCL 2.x) | stream | poll |",
        "|---|---:|---:|---:|---:|",
    ]
    return "\n".join(head + rows), data


def mean_item_bytes(dynamodb: str, table: str) -> float:
    import boto3

    from shardflow.leases.memory import item_size

    client = boto3.client("dynamodb", endpoint_url=dynamodb, region_name=REGION)
    items = client.scan(TableName=table, ConsistentRead=True)["Items"]
    return statistics.mean(item_size(item) for item in items) if items else 300.0


# --- the report ---------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    by = {(o.scenario, o.mode): o for o in outcomes}
    lines = [
        "| scenario | mode | p99 gap, worst shard (median shard) | longest gap (worst shard) "
        "| processed twice | never processed | takeover |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, title in SCENARIOS.items():
        for mode in MODES:
            o = by.get((key, mode))
            if o is None:
                continue
            takeover = f"{o.takeover:.2f} s" if o.takeover is not None else "-"
            label = "handoff + stream pick-up" if mode == "handoff" else "baseline (KCL 2.x style)"
            lines.append(
                f"| ({key}) {title} | {label} | {o.gap_p99:.2f} s ({o.gap_p99_median:.2f} s) "
                f"| {o.gap_max:.2f} s "
                f"| {o.duplicates} | {o.lost} | {takeover} |"
            )
    return "\n".join(lines)


def ratios(outcomes: list[Outcome]) -> str:
    by = {(o.scenario, o.mode): o for o in outcomes}
    out = []
    for key in SCENARIOS:
        h, b = by.get((key, "handoff")), by.get((key, "baseline"))
        if h is None or b is None:
            continue
        part = f"({key}) longest gap: baseline / handoff = {b.gap_max / max(h.gap_max, 1e-3):.1f}x"
        if h.takeover and b.takeover:
            part += f"; takeover baseline / handoff = {b.takeover / h.takeover:.1f}x"
        out.append(part)
    return "\n".join(out)


def per_shard_table(outcome: Outcome) -> str:
    cells = ", ".join(
        f"{shard[-3:]}: {v['p99_gap']:.2f}s/{v['longest_gap']:.2f}s/{v['duplicates']}/{v['lost']}"
        for shard, v in sorted(outcome.per_shard.items())
    )
    return f"  ({outcome.scenario}) {outcome.mode}: per shard p99 gap/longest/twice/lost: {cells}"


def explain_lines(outcome: Outcome) -> list[str]:
    """Where the scenario's pauses went: moves step by step, then the shards that stayed."""
    lines = []
    if outcome.handoffs:
        lines += [f"handoffs: {line}" for line in fleet_timeline.describe(outcome.handoffs)]
    if outcome.stays:
        longer = outcome.stays["longer_than"]
        lines += [
            f"stayed: {line}" for line in fleet_timeline.describe_stays(outcome.stays, longer)
        ]
    return lines


def explain_notes(outcomes: list[Outcome]) -> list[str]:
    """For the rendered table: per planned scenario with handoff, the median move's stages,
    the slowest move's, and the pauses of shards that stayed (runs before they were
    recorded: none)."""
    notes = []
    for o in outcomes:
        if o.mode != "handoff" or o.scenario == "c" or not o.handoffs:
            continue
        notes.append(
            f"({o.scenario}) where the pauses went: {fleet_timeline.handoff_line(o.handoffs)}"
        )
        if o.stays:
            stayed = fleet_timeline.describe_stays(o.stays, o.stays["longer_than"])[0]
            notes.append(f"({o.scenario}) shards that did not move: {stayed}")
    return notes


def targets(outcomes: list[Outcome]) -> list[str]:
    verdicts = []
    for o in outcomes:
        if o.mode != "handoff":
            continue
        checks = [o.lost == 0]
        if o.scenario in ("a", "b", "d"):
            checks += [o.gap_max <= 1.0, o.duplicates == 0]
        else:
            checks += [o.takeover is not None and o.takeover <= FAILOVER + 2.0]
        verdicts.append(f"({o.scenario}) {'met' if all(checks) else 'MISSED'}")
    return verdicts


def parent(args: argparse.Namespace) -> None:
    from shardflow.local import DynaliteServer, KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    rounds: list[list[Outcome]] = []
    started = time.monotonic()
    item_bytes = 300.0
    for round_no in range(1, args.repeat + 1):
        if args.repeat > 1:
            print(f"round {round_no} of {args.repeat} (fresh emulators)", flush=True)
        outcomes: list[Outcome] = []
        lease_server = DynaliteServer() if args.lease_server == "dynalite" else MotoServer()
        with KinesaliteServer() as kinesalite, lease_server as moto:
            for key in args.scenarios.split(","):
                for mode in args.modes.split(","):
                    print(f"scenario ({key}) {SCENARIOS[key]}, {mode} ...", flush=True)
                    scenario = Scenario(args, key, mode, kinesalite.endpoint_url, moto.endpoint_url)
                    outcome = scenario.run()
                    print(per_shard_table(outcome), flush=True)
                    for line in explain_lines(outcome):
                        print(f"  {line}", flush=True)
                    outcomes.append(outcome)
                    item_bytes = mean_item_bytes(moto.endpoint_url, scenario.app)
        rounds.append(outcomes)
    outcomes = combine(rounds)
    _, cost_data = costs(item_bytes)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    settings = (
        f"{args.shards} shards x {args.rate_per_shard:g} records/s, failover {FAILOVER:g} s, take cycle "
        f"{TAKE_EVERY:.2f} s, polling idle {IDLE_TIME:g} s, pick-up every {PICKUP_INTERVAL:g} s "
        f"({'DynamoDB stream' if args.lease_server == 'moto' else 'polled'}), lease table on "
        f"{args.lease_server}, successor_wait {SUCCESSOR_WAIT:g} s (handoff mode), observed "
        f"{args.observe:g} s after each action"
    )
    payload = {
        "benchmark": "handoff",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": machine,
        "seconds": round(time.monotonic() - started),
        "settings": settings,
        "shards": args.shards,
        "lease_server": args.lease_server,
        "repeat": args.repeat,
        "outcomes": [asdict(o) for o in outcomes],
        "costs": cost_data,
    }
    print("\n" + render(payload) + "\n\n" + render_costs(payload))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / results_name(args.shards, args.lease_server)).write_text(
        json.dumps(payload, indent=2) + "\n"
    )


ROUND_FIGURES = ("gap_max", "gap_p99", "gap_p99_median", "duplicates", "lost", "takeover")


def combine(rounds: list[list[Outcome]]) -> list[Outcome]:
    """One outcome per scenario and mode over rounds of the same scenarios: the median of each
    gap and takeover, records twice and lost summed over the rounds (any is one too many), the
    per-shard figures and the step-by-step pauses of the median round (by longest gap), and
    every round's own figures in ``rounds``. One round: as it is."""
    if len(rounds) == 1:
        return rounds[0]
    by: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for outcomes in rounds:
        for o in outcomes:
            by[o.scenario, o.mode].append(o)
    combined = []
    for runs in by.values():
        ranked = sorted(runs, key=lambda o: o.gap_max)
        middle = ranked[(len(ranked) - 1) // 2]
        takeovers = [o.takeover for o in runs if o.takeover is not None]
        combined.append(
            replace(
                middle,
                gap_max=round(statistics.median(o.gap_max for o in runs), 3),
                gap_p99=round(statistics.median(o.gap_p99 for o in runs), 3),
                gap_p99_median=round(statistics.median(o.gap_p99_median for o in runs), 3),
                duplicates=sum(o.duplicates for o in runs),
                lost=sum(o.lost for o in runs),
                written=sum(o.written for o in runs),
                takeover=round(statistics.median(takeovers), 3) if takeovers else None,
                took=round(sum(o.took for o in runs), 1),
                rounds=[{k: getattr(o, k) for k in ROUND_FIGURES} for o in runs],
            )
        )
    return combined


def rounds_notes(outcomes: list[Outcome]) -> list[str]:
    """For a run of several rounds: what the table's medians are made of."""
    notes = []
    for o in outcomes:
        if not o.rounds:
            continue
        gaps = " / ".join(f"{r['gap_max']:.2f}" for r in o.rounds)
        part = f"({o.scenario}) {o.mode}: longest gap per round {gaps} s"
        if o.takeover is not None:
            part += ", takeover " + " / ".join(
                f"{r['takeover']:.2f}" for r in o.rounds if r["takeover"] is not None
            )
            part += " s"
        part += (
            f"; twice {' / '.join(str(r['duplicates']) for r in o.rounds)}, lost "
            f"{' / '.join(str(r['lost']) for r in o.rounds)}"
        )
        notes.append(part)
    if notes:
        notes.insert(
            0,
            f"medians of {len(outcomes[0].rounds)} rounds, each on fresh emulators; records "
            "twice and lost are the sums over the rounds",
        )
    return notes


def results_name(shards: int, lease_server: str) -> str:
    """handoff.json for the docs' run (8 shards, moto), else handoff-<N>[-<server>].json."""
    if shards == SHARDS and lease_server == "moto":
        return "handoff.json"
    return f"handoff-{shards}" + ("" if lease_server == "moto" else f"-{lease_server}") + ".json"


def render(result: dict[str, Any]) -> str:
    """The scenarios' table of one run, from its JSON (bench/tables.py puts it into the docs)."""
    outcomes = [Outcome(**o) for o in result["outcomes"]]
    notes = [
        *ratios(outcomes).splitlines(),
        f"targets (handoff): {', '.join(targets(outcomes))}",
        *explain_notes(outcomes),
        *rounds_notes(outcomes),
    ]
    return "\n".join(
        [
            table(outcomes),
            "",
            *(f"- {note}" for note in notes),
            "",
            f"({result['settings']}; {result['machine']}; {result['seconds']} s in all)",
        ]
    )


def render_summary(result: dict[str, Any]) -> str:
    """The run in one sentence, for the handoff guide."""
    by = {(o["scenario"], o["mode"]): o for o in result["outcomes"]}
    a, a0 = by["a", "handoff"], by["a", "baseline"]
    b, b0 = by["b", "handoff"], by["b", "baseline"]
    c, c0 = by["c", "handoff"], by["c", "baseline"]
    lost = sum(o["lost"] for o in result["outcomes"])

    def twice(o: dict[str, Any]) -> str:
        return "no record twice" if o["duplicates"] == 0 else f"{o['duplicates']:,} twice"

    return (
        f"a rolling restart of 2 workers on {result.get('shards', SHARDS)} shards left no shard idle longer than "
        f"{a['gap_max']:.2f} s (baseline: {a0['gap_max']:.2f} s) and handled {twice(a)} "
        f"(baseline: {twice(a0)}); scaling out 2 → 4 paused a shard at most "
        f"{b['gap_max']:.2f} s with {twice(b)} (baseline: {twice(b0)}, from overlapping "
        f"steals); after a kill -9 the dead worker's shards were taken over within "
        f"{c['takeover']:.2f} s with a {FAILOVER:g} s failover time (baseline: "
        f"{c0['takeover']:.2f} s). "
        + ("No record was lost in any run." if lost == 0 else f"{lost:,} records were LOST.")
    )


def render_costs(result: dict[str, Any]) -> str:
    """What pick-up costs, priced with the lease item size measured in the run."""
    return costs(result["costs"]["item_bytes"])[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenarios", default="a,b,c,d")
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument(
        "--settle",
        type=float,
        help="seconds to wait at most for the first 2 workers to split the shards evenly "
        "(default 60 + shards); the action follows the warm-up even if they have not",
    )
    parser.add_argument(
        "--lease-server",
        choices=("moto", "dynalite"),
        default="moto",
        help="the lease table's server: moto (with its DynamoDB stream; serialized, ~110 "
        "conditional writes/s) or dynalite (concurrent; no stream, so pick-up polls)",
    )
    parser.add_argument(
        "--rate-per-shard", type=float, default=RATE_PER_SHARD, help="records/s to each shard"
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds, each on fresh emulators; the result holds the medians (see combine)",
    )
    parser.add_argument(
        "--observe", type=float, default=TAKE_EVERY + 4.0, help="seconds after the action"
    )
    parser.add_argument("--child-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--application", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_worker:
        worker_child(args)
    else:
        stop_on_sigterm()
        parent(args)


if __name__ == "__main__":
    main()
