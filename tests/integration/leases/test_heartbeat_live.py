"""The heartbeat lease mode with real worker processes on moto's DynamoDB and Kinesis.

Two consumers (``bench/chaos_roles.py worker``, each its own OS process, failover 2 s) share
a 4-shard stream fed by a producer process; each worker reaches the lease table through its own
:class:`~shardflow.testing.FaultProxy`. The table's mode is ``heartbeat`` before they start.
Every handler call is logged with its start and end (wall clock); the check is that no two
workers ever ran handler calls for one shard at once, through:

- a brownout of one worker's DynamoDB calls (HTTP 500 on every call, for 3 failover times):
  it stops its shards, the other takes them over (after fencing its heartbeat);
- SIGSTOP of one worker for 3 failover times, then SIGCONT: its shards are taken while it is
  frozen, and once it runs again it starts no handler call of a shard it lost (a call frozen
  mid-way finishes: it began while the lease was valid, as in per-lease mode).

Only processes this test started are signalled, by PID.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.leases import DynamoDBLeaseStore
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.boto import boto_client, make_stream

ROLES = Path(__file__).resolve().parents[3] / "bench" / "chaos_roles.py"
FAILOVER = 2.0
SHARDS = 4


@dataclass(frozen=True)
class Call:
    worker: str
    shard: str
    start: float
    end: float


class Fleet:
    """The producer and two workers of one test; every process stopped at the end."""

    def __init__(self, tmp: Path, moto_url: str, stream: str, app: str) -> None:
        self.tmp = tmp
        self.moto_url = moto_url
        self.stream = stream
        self.app = app
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.proxies: dict[str, FaultProxy] = {}

    def start_producer(self) -> None:
        self._spawn(
            "producer",
            ["producer", "--stream", self.stream, "--kinesis", self.moto_url],
            ["--out", str(self.tmp / "produced.tsv"), "--rate", "40", "--poison-every", "1e9"],
        )

    def start_worker(self, name: str) -> None:
        proxy = FaultProxy(self.moto_url, seed=1)
        proxy.__enter__()
        self.proxies[name] = proxy
        self._spawn(
            name,
            ["worker", "--stream", self.stream, "--app", self.app, "--kinesis", self.moto_url],
            [
                "--dynamodb",
                proxy.url,
                "--guard-table",
                "",
                "--worker-id",
                name,
                "--out",
                str(self.tmp / f"{name}.tsv"),
                "--dead-letters",
                str(self.tmp / f"{name}-dead.jsonl"),
                "--failover",
                str(FAILOVER),
            ],
        )

    def _spawn(self, name: str, head: list[str], tail: list[str]) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, str(ROLES), *head, *tail], stdout=log, stderr=log
        )

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def calls(self) -> list[Call]:
        started: dict[tuple[str, ...], float] = {}
        calls = []
        for path in self.tmp.glob("w-*.tsv"):
            for line in path.read_text().splitlines():
                fields = line.split("\t")
                if fields[0] == "S":
                    started[tuple(fields[1:5])] = float(fields[7])
                elif fields[0] == "E":
                    key = tuple(fields[1:5])
                    begun = started.pop(key, None)
                    if begun is not None:
                        calls.append(Call(fields[1], fields[2], begun, float(fields[7])))
        for key, begun in started.items():
            calls.append(Call(key[0], key[1], begun, float("inf")))  # never ended
        return calls

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(5)
        for proxy in self.proxies.values():
            proxy.__exit__(None, None, None)


@pytest.fixture
def fleet(tmp_path: Path, moto_url: str, stream_name: str) -> Iterator[Fleet]:
    make_stream(moto_url, stream_name, SHARDS)
    app = f"{stream_name}-app"

    async def heartbeat_mode() -> None:
        async with DynamoDBLeaseStore.connect(
            ClientFactory(AwsSettings(endpoint_url=moto_url)), app
        ) as store:
            await store.ensure_table()
            await store.set_lease_mode("heartbeat")

    asyncio.run(heartbeat_mode())
    fleet = Fleet(tmp_path, moto_url, stream_name, app)
    try:
        yield fleet
    finally:
        fleet.stop()


def wait_for(what: str, done: Callable[[], bool], limit: float, fleet: Fleet) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.2)
    logs = "\n".join(f"--- {n}\n{fleet.log(n)[-2500:]}" for n in fleet.processes)
    raise AssertionError(f"{what} not within {limit}s\n{logs}")


def leases(fleet: Fleet) -> dict[str, str | None]:
    """Shard -> the worker processing it, as the table says."""
    ddb = boto_client("dynamodb", fleet.moto_url)
    items = ddb.scan(TableName=fleet.app, ConsistentRead=True)["Items"]
    found = {}
    for item in items:
        if "entityType" in item:
            continue
        owner = item.get("checkpointOwner", item.get("leaseOwner", {})).get("S")
        found[item["leaseKey"]["S"]] = owner
    return found


def heartbeats_cover(fleet: Fleet, *workers: str) -> bool:
    return all(f"worker {name} keeps a heartbeat" in fleet.log(name) for name in workers) and all(
        "leases renewed one by one" in fleet.log(name) for name in workers
    )


def overlaps(calls: list[Call], *, frozen: tuple[str, float] | None = None) -> list[str]:
    """Moments two workers processed one shard at once, by ownership stretches: per shard, the
    calls in order of start grouped into runs of one worker; a run lasts from its first call's
    start to its last call's end, and runs of different workers must not overlap (handler
    calls at a few records a second rarely meet, stretches of a stale owner do). With
    ``frozen`` (worker, time of its SIGSTOP) a call of that worker begun before the stop counts
    as ending where it began: it began while the lease was valid and was frozen mid-way."""
    found = []
    by_shard: dict[str, list[Call]] = {}
    for call in calls:
        end = call.end
        if frozen is not None and call.worker == frozen[0] and call.start < frozen[1]:
            end = call.start
        by_shard.setdefault(call.shard, []).append(Call(call.worker, call.shard, call.start, end))
    for shard, shard_calls in by_shard.items():
        shard_calls.sort(key=lambda c: c.start)
        runs: list[Call] = []
        for call in shard_calls:
            if runs and runs[-1].worker == call.worker:
                last = runs[-1]
                runs[-1] = Call(last.worker, shard, last.start, max(last.end, call.end))
            else:
                runs.append(call)
        for earlier, later in itertools.pairwise(runs):
            if later.start < earlier.end:
                found.append(f"{shard}: {earlier} overlaps {later}")
    return found


def established(fleet: Fleet) -> dict[str, str | None]:
    fleet.start_producer()
    fleet.start_worker("w-a")
    fleet.start_worker("w-b")
    # The heartbeat stands in for renewals one take interval + 1 s after it started.
    settle = 2 * (FAILOVER + 0.025) + 1.0
    wait_for("both heartbeats", lambda: heartbeats_cover(fleet, "w-a", "w-b"), 60, fleet)
    time.sleep(settle + 1.0)
    held = leases(fleet)
    wait_for(
        "both workers holding shards",
        lambda: set(leases(fleet).values()) == {"w-a", "w-b"},
        30,
        fleet,
    )
    return held


@pytest.mark.timeout(180)
def test_a_dynamodb_brownout_of_one_worker_hands_its_shards_over_with_no_overlap(
    fleet: Fleet,
) -> None:
    established(fleet)
    before = leases(fleet)
    victims = {shard for shard, owner in before.items() if owner == "w-a"}
    assert victims
    browned = time.time()
    rule = fleet.proxies["w-a"].add(ErrorResponse("InternalServerError"), service="DynamoDB")
    wait_for(
        "w-b holding every shard",
        lambda: set(leases(fleet).values()) == {"w-b"},
        FAILOVER * 4 + 10,
        fleet,
    )
    time.sleep(FAILOVER)
    fleet.proxies["w-a"].remove(rule)
    time.sleep(FAILOVER * 2)
    fleet.stop()
    calls = fleet.calls()
    assert not overlaps(calls), overlaps(calls)[:5]
    handled_by_b = {c.shard for c in calls if c.worker == "w-b" and c.start > browned}
    assert victims <= handled_by_b, "w-b took over w-a's shards and handled records"
    assert any(c.worker == "w-a" and c.start < browned for c in calls)
    assert "fenced it" in fleet.log("w-b"), "w-b fenced w-a's heartbeat before taking"


@pytest.mark.timeout(180)
def test_a_worker_frozen_past_failover_starts_no_call_of_a_shard_it_lost(fleet: Fleet) -> None:
    established(fleet)
    before = leases(fleet)
    victims = {shard for shard, owner in before.items() if owner == "w-a"}
    assert victims
    frozen_at = time.time()
    os.kill(fleet.processes["w-a"].pid, signal.SIGSTOP)
    try:
        wait_for(
            "w-b holding every shard",
            lambda: set(leases(fleet).values()) == {"w-b"},
            FAILOVER * 4 + 10,
            fleet,
        )
        time.sleep(FAILOVER)
    finally:
        os.kill(fleet.processes["w-a"].pid, signal.SIGCONT)
    time.sleep(FAILOVER * 2)
    fleet.stop()
    calls = fleet.calls()
    assert not overlaps(calls, frozen=("w-a", frozen_at)), overlaps(calls)[:5]
    handled_by_b = {c.shard for c in calls if c.worker == "w-b" and c.start > frozen_at}
    assert victims <= handled_by_b
    assert "fenced it" in fleet.log("w-b")
