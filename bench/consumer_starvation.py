"""Intake never starves the event loop: lease renewals stay on time while shards drain aggregates.

Kinesis runs on kinesalite, the lease table on moto's DynamoDB. Each of 8 shards is preloaded
with full-size KPL aggregates (1 MiB, ~100,000 user records of 4 bytes each); one consumer
process with ``failover_time`` 2 s drains them all with a batch handler that only counts.
Unpacking one such aggregate at once takes a third of a second, so an intake that does not
yield lets lease renewals slip past their deadline and leases get lost.

Measured from the consumer's own diagnostic events: renewal lateness is the gap between two
successive renewals of one lease minus the renew interval (so it includes the write's own
time); leases lost are LeaseLost events. The baseline is the same consumer on an 8-shard
stream with nothing to read, in the same child process, just before. The target (issue 10):
p99 lateness under 10 % of ``failover_time`` and no lease lost.

    .venv/bin/python bench/consumer_starvation.py              # ~2 minutes on 2 cores
    .venv/bin/python bench/consumer_starvation.py --aggregates 2 --idle 5
    .venv/bin/python bench/consumer.py --parts starve           # the same, as a consumer part
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet_kit import stack_env

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
REGION = "us-east-1"
SHARDS = 8
FAILOVER = 2.0
LOADED_STREAM = "bench-starvation-loaded"
IDLE_STREAM = "bench-starvation-idle"
USER_RECORD = b"data"  # 4 bytes: as many user records per aggregate as the format allows


# --- the child: one consumer, idle first, then draining -------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def lateness(renewals: dict[str, list[float]], interval: float) -> list[float]:
    """Per lease, each gap between two successive renewals beyond the renew interval."""
    late: list[float] = []
    for times in renewals.values():
        ordered = sorted(times)
        late += [max(0.0, b - a - interval) for a, b in itertools.pairwise(ordered)]
    return late


async def watch(stream: str, application: str, expected: int, limit: float) -> dict[str, Any]:
    """Consume ``stream`` until ``expected`` records were handled (or, for 0, ``limit`` s)."""
    from shardflow.consumer import Consumer, ConsumerSettings
    from shardflow.events import DiagnosticEvent, LeaseLost, LeaseRenewed
    from shardflow.fetch import Polling
    from shardflow.leases.settings import LeaseSettings

    leases = LeaseSettings(failover_time=FAILOVER)
    renewals: dict[str, list[float]] = defaultdict(list)
    writes: list[float] = []
    lags: list[float] = []
    lost: list[str] = []
    pauses: list[float] = []  # full (generation 2) garbage collections: the loop stops
    handled = 0
    done = asyncio.Event()
    collecting = 0.0

    def on_gc(phase: str, info: dict[str, int]) -> None:
        nonlocal collecting
        if info["generation"] != 2:
            return
        if phase == "start":
            collecting = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - collecting)

    def on_event(event: DiagnosticEvent) -> None:
        if isinstance(event, LeaseRenewed):
            renewals[event.lease_key].append(time.monotonic())
            writes.append(event.duration)
        elif isinstance(event, LeaseLost):
            lost.append(event.lease_key)

    async def handle(records: list[Any]) -> None:
        nonlocal handled
        handled += len(records)
        if expected and handled >= expected:
            done.set()

    consumer = Consumer(
        stream,
        application,
        settings=ConsumerSettings(leases=leases, fetch=Polling(idle_time=0.2)),
        on_event=on_event,
    )

    async def probe() -> None:
        # How late the loop runs a 10 ms sleep: what every task on it waits extra.
        while True:
            asked = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - asked - 0.01)

    run = asyncio.create_task(consumer.consume(handle, batch=True))
    prober = asyncio.create_task(probe())
    started = time.monotonic()
    gc.callbacks.append(on_gc)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), limit)
    seconds = time.monotonic() - started
    gc.callbacks.remove(on_gc)
    prober.cancel()
    await consumer.close()
    await run
    late = lateness(renewals, leases.renew_every)
    return {
        "records": handled,
        "seconds": seconds,
        "renewals": sum(len(t) for t in renewals.values()),
        "renew_interval": leases.renew_every,
        "lateness_p50": percentile(late, 50),
        "lateness_p99": percentile(late, 99),
        "lateness_max": max(late, default=0.0),
        "leases_lost": len(lost),
        "renew_write_p99": percentile(writes, 99),
        "loop_lag_p99": percentile(lags, 99),
        "loop_lag_max": max(lags, default=0.0),
        "full_collections": len(pauses),
        "full_collection_max": max(pauses, default=0.0),
        "full_collection_seconds": sum(pauses),
    }


def child(args: argparse.Namespace) -> None:
    async def both() -> dict[str, Any]:
        idle = await watch(IDLE_STREAM, f"{IDLE_STREAM}-app", 0, args.idle)
        loaded = await watch(LOADED_STREAM, f"{LOADED_STREAM}-app", args.expected, args.limit)
        return {"idle": idle, "draining": loaded}

    print(json.dumps(asyncio.run(both())))


# --- the parent: servers, data, the child, the table ------------------------------------------


def aggregates_per_shard(client: Any, stream: str, count: int) -> int:
    """Put ``count`` full aggregates on every shard (each pinned by its explicit hash key);
    returns the number of user records written."""
    from shardflow.aggregation import AggregateBuilder

    shards = client.list_shards(StreamName=stream)["Shards"]
    builder = AggregateBuilder()
    total = 0
    for shard in shards:
        hash_key = shard["HashKeyRange"]["StartingHashKey"]
        for _ in range(count):
            builder.clear()
            while builder.try_add("k", USER_RECORD, hash_key):
                pass
            built = builder.build()
            client.put_record(
                StreamName=stream,
                Data=built.data,
                PartitionKey=built.partition_key,
                ExplicitHashKey=hash_key,
            )
            total += built.count
    return total


def measure(args: argparse.Namespace, kinesis: str, dynamodb: str) -> dict[str, Any]:
    """Preload, then run the child; the result as JSON-ready values."""
    import boto3

    client = boto3.client("kinesis", endpoint_url=kinesis, region_name=REGION)
    for stream in (IDLE_STREAM, LOADED_STREAM):
        client.create_stream(StreamName=stream, ShardCount=SHARDS)
        client.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 600}
        )
    expected = aggregates_per_shard(client, LOADED_STREAM, args.aggregates)
    print(f"preloaded {SHARDS} shards x {args.aggregates} aggregates: {expected:,} user records")
    env = stack_env(kinesis, dynamodb)
    command = [
        sys.executable,
        __file__,
        "--child",
        f"--expected={expected}",
        f"--idle={args.idle}",
        f"--limit={args.limit}",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=args.limit * 3, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the consumer exited with {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result | {
        "shards": SHARDS,
        "aggregates_per_shard": args.aggregates,
        "user_records": expected,
        "failover_time": FAILOVER,
    }


def render(result: dict[str, Any]) -> str:
    """The table of one run, from its JSON."""
    rows = [
        "| phase | records handled | renewals | lateness p50 | lateness p99 | max | leases lost |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, label in (("idle", "idle (baseline)"), ("draining", "draining aggregates")):
        m = result[phase]
        rows.append(
            f"| {label} | {m['records']:,} | {m['renewals']} | {m['lateness_p50'] * 1000:.0f} ms "
            f"| {m['lateness_p99'] * 1000:.0f} ms | {m['lateness_max'] * 1000:.0f} ms "
            f"| {m['leases_lost']} |"
        )
    for phase, label in (("idle", "idle"), ("draining", "draining")):
        m = result[phase]
        if "loop_lag_p99" in m:
            collections = (
                f"; {m['full_collections']} full garbage collections (the loop stops for each) "
                f"took {m['full_collection_seconds']:.1f} s, the longest "
                f"{m['full_collection_max'] * 1000:.0f} ms"
                if m.get("full_collections")
                else ""
            )
            rows.append(
                f"\n{label}: event loop lag (a 10 ms sleep's overrun) p99 "
                f"{m['loop_lag_p99'] * 1000:.0f} ms, max {m['loop_lag_max'] * 1000:.0f} ms; "
                f"renewal write p99 {m['renew_write_p99'] * 1000:.0f} ms{collections}"
            )
    draining = result["draining"]
    share = draining["lateness_p99"] / result["failover_time"]
    verdict = "met" if share < 0.10 and draining["leases_lost"] == 0 else "NOT met"
    drained = "all" if draining["records"] >= result["user_records"] else "NOT all"
    return "\n".join(
        [
            *rows,
            "",
            f"{result['shards']} shards x {result['aggregates_per_shard']} aggregates of 1 MiB "
            f"({result['user_records']:,} user records, {drained} handled), failover_time "
            f"{result['failover_time']:g} s, renewals every {draining['renew_interval']:.3f} s: "
            f"p99 lateness while draining is {share:.1%} of failover_time "
            f"(target < 10 %, no lease lost: {verdict}). ({result['machine']})",
        ]
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the emulators, measure, print and store the result."""
    from shardflow.local import KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    with KinesaliteServer() as kinesalite, MotoServer() as moto:
        result = measure(args, kinesalite.endpoint_url, moto.endpoint_url)
    result |= {
        "benchmark": "consumer_starvation",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    print("\n" + render(result))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "consumer_starvation.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--aggregates", type=int, default=4, help="1 MiB aggregates per shard")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle baseline")
    parser.add_argument("--limit", type=float, default=240.0, help="seconds the drain may take")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--expected", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
