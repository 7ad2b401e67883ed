"""Ordering modes against their ideal: 10,000 records, one shard, a handler that awaits 2.5 ms.

Kinesis runs on kinesalite, the lease table on moto's DynamoDB. One stream of 10,000 records
(1,000 distinct partition keys, each key's 10 records spread over the stream) is preloaded once;
each contender drains all of it from TRIM_HORIZON under a fresh application name (a fresh lease
table), in this process, one after the other. Wall time runs from ``consume()`` being called to
the last record handled; every contender verifies it handled each record exactly once, and the
ordered modes that each key's records started in stream order.

Ideal times: ``shard`` mode handles one record at a time: records x 2.5 ms. ``key`` and
``unordered`` with a per-shard in-flight bound B: max(records x 2.5 ms / B, the longest chain of
one key x 2.5 ms) (key mode: a key's records one at a time). The no-op rows drain the same
stream with a handler that does nothing: the consumer's own cost (lease table, leases,
GetRecords, checkpoints), which every row pays on top of its ideal.

    .venv/bin/python bench/parallel.py                 # ~1 minute (shard mode alone >= 25 s)
    .venv/bin/python bench/parallel.py --repeat 3      # median of 3 rounds per contender
    .venv/bin/python bench/parallel.py --records 2000 --contenders no-op,key
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# make bench (the short mode) writes elsewhere: only full runs are the docs' figures.
RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
REGION = "us-east-1"
STREAM = "bench-parallel"


@dataclass(frozen=True)
class Contender:
    name: str
    ordering: str | None
    """None: no dispatch settings (the consumer's default path)."""
    bound: int
    """max_in_flight_per_shard."""
    work: bool
    """Whether the handler awaits the latency."""


CONTENDERS = [
    Contender("no-op", None, 1, work=False),
    Contender("no-op, key mode", "key", 256, work=False),
    Contender("shard", "shard", 256, work=True),
    Contender("key", "key", 256, work=True),
    Contender("unordered", "unordered", 256, work=True),
    Contender("key, B=1000", "key", 1000, work=True),
    Contender("unordered, B=1000", "unordered", 1000, work=True),
]


@dataclass
class Outcome:
    contender: str
    ordering: str
    in_flight_bound: int
    records: int
    seconds: float
    ideal_seconds: float
    handled: int
    distinct: int
    key_order_kept: bool
    error: str | None

    @property
    def verified(self) -> bool:
        return self.error is None and self.handled == self.distinct == self.records

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds


def ideal_seconds(contender: Contender, records: int, chain: int, latency: float) -> float:
    if not contender.work:
        return 0.0
    if contender.ordering == "shard":
        return records * latency
    longest = chain * latency if contender.ordering == "key" else latency
    return max(records * latency / contender.bound, longest)


async def drain(contender: Contender, args: argparse.Namespace, index: int) -> Outcome:
    from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
    from shardflow.consumer.delivery import DispatchSettings

    dispatch = (
        None
        if contender.ordering is None
        else DispatchSettings(
            ordering=contender.ordering,  # type: ignore[arg-type]
            max_in_flight_per_shard=contender.bound,
        )
    )
    consumer = Consumer(
        STREAM,
        f"bench-parallel-{index}-{os.getpid()}",
        settings=ConsumerSettings(dispatch=dispatch),
    )
    seen: set[int] = set()
    handled = 0
    starts: dict[str, list[int]] = defaultdict(list)
    done = asyncio.Event()
    latency = args.latency_ms / 1000

    async def handle(record: ConsumedRecord[bytes]) -> None:
        nonlocal handled
        number = int(record.data)
        starts[record.partition_key].append(number)
        if contender.work:
            await asyncio.sleep(latency)
        handled += 1
        seen.add(number)
        if handled >= args.records:
            done.set()

    started = time.perf_counter()
    run = asyncio.create_task(consumer.consume(handle))
    error: str | None = None
    finished = time.perf_counter()
    try:
        waiting = asyncio.ensure_future(done.wait())
        await asyncio.wait({waiting, run}, timeout=args.timeout, return_when="FIRST_COMPLETED")
        finished = time.perf_counter()
        if not done.is_set():
            waiting.cancel()
            error = "crashed" if run.done() else f"timed out after {args.timeout:.0f} s"
    finally:
        await consumer.close()
        await run
    ordered = contender.ordering in ("shard", "key")
    key_order = all(s == sorted(s) for s in starts.values()) if ordered else True
    if ordered and not key_order:
        error = error or "a key's records started out of order"
    return Outcome(
        contender=contender.name,
        ordering=contender.ordering or "(none)",
        in_flight_bound=contender.bound,
        records=args.records,
        seconds=finished - started,
        ideal_seconds=ideal_seconds(contender, args.records, args.records // args.keys, latency),
        handled=handled,
        distinct=len(seen),
        key_order_kept=key_order,
        error=error,
    )


def preload(endpoint: str, records: int, keys: int) -> None:
    import boto3

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name=REGION)
    client.create_stream(StreamName=STREAM, ShardCount=1)
    client.get_waiter("stream_exists").wait(
        StreamName=STREAM, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )
    entries = [{"Data": str(i).encode(), "PartitionKey": f"key-{i % keys}"} for i in range(records)]
    for start in range(0, len(entries), 500):
        batch = entries[start : start + 500]
        while batch:
            answer = client.put_records(StreamName=STREAM, Records=batch)
            batch = [e for e, r in zip(batch, answer["Records"], strict=True) if "ErrorCode" in r]


def render(result: dict[str, Any]) -> str:
    """The table of one run, from its JSON (bench/tables.py puts it into the docs)."""
    names = [f.name for f in fields(Outcome)]
    outcomes = [Outcome(**{k: o[k] for k in names}) for o in result["outcomes"]]
    order = result.get("order", "each contender's rounds in a row")
    args = argparse.Namespace(**result["args"])
    return f"{table(outcomes, args, order)}\n\n({result['machine']})"


def table(outcomes: list[Outcome], args: argparse.Namespace, order: str) -> str:
    baseline = next((o.seconds for o in outcomes if o.contender == "no-op"), None)
    lines = [
        f"{args.records:,} records on 1 shard (kinesalite; leases on moto), {args.keys:,} keys, "
        f"handler awaits {args.latency_ms} ms, median of {args.repeat} round(s), {order}",
        "",
        f"One `await asyncio.sleep({args.latency_ms / 1000})` alone, in the same process, took "
        f"{args.measured_latency_ms:.2f} ms on average (400 in a row, no consumer): shard mode "
        f"cannot beat {args.records:,} x that = "
        f"{args.records * args.measured_latency_ms / 1000:.1f} s here.",
        "",
        "| mode | in-flight bound | wall | ideal | x ideal | no-op drain + ideal "
        "| x (no-op drain + ideal) | records/s | verified |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        ratio = f"{o.seconds / o.ideal_seconds:.2f}x" if o.ideal_seconds else "-"
        floor = None if baseline is None else baseline + o.ideal_seconds
        floor_text = "-" if floor is None else f"{floor:.2f} s"
        floor_ratio = "-" if floor is None else f"{o.seconds / floor:.2f}x"
        bound = "-" if o.ordering == "(none)" else f"{o.in_flight_bound:,}"
        verified = "yes" if o.verified else f"NO: {o.error or 'missing records'}"
        lines.append(
            f"| {o.contender} | {bound} | {o.seconds:.2f} s | {o.ideal_seconds:.2f} s | {ratio} "
            f"| {floor_text} | {floor_ratio} | {o.records_per_second:,.0f} | {verified} |"
        )
    return "\n".join(lines)


async def measured_latency(latency: float, calls: int = 400) -> float:
    """Seconds one ``await asyncio.sleep(latency)`` really takes here (timer granularity and a
    busy shared machine add to it): the handler's own floor, without any consumer."""
    started = time.perf_counter()
    for _ in range(calls):
        await asyncio.sleep(latency)
    return (time.perf_counter() - started) / calls


async def run_all(args: argparse.Namespace, chosen: list[Contender]) -> list[Outcome]:
    args.measured_latency_ms = 1000 * await measured_latency(args.latency_ms / 1000)
    print(f"one await of a {args.latency_ms} ms sleep takes {args.measured_latency_ms:.2f} ms")
    # A first drain pays for imports, connections and moto's first table: not reported.
    warm_up = await drain(CONTENDERS[0], args, 0)
    print(f"warm-up (no-op, not reported): {warm_up.seconds:.2f} s", flush=True)
    rounds: dict[str, list[Outcome]] = {c.name: [] for c in chosen}
    # Round-robin over the contenders, the order rotated each round, so that a noisy spell of
    # the shared machine (or going first) is not one contender's alone.
    for round_ in range(args.repeat):
        turn = round_ % len(chosen)
        for contender in chosen[turn:] + chosen[:turn]:
            index = chosen.index(contender) + 1
            outcome = await drain(contender, args, index * 100 + round_)
            print(
                f"round {round_ + 1}: {contender.name}: {outcome.seconds:.2f} s "
                f"({'verified' if outcome.verified else outcome.error})",
                flush=True,
            )
            rounds[contender.name].append(outcome)
    return [median_outcome(rounds[c.name]) for c in chosen]


def median_outcome(rounds: list[Outcome]) -> Outcome:
    """The median of the rounds' seconds (of two rounds: their mean); a failed round fails the
    contender."""
    failed = next((o for o in rounds if not o.verified), None)
    if failed is not None:
        return failed
    return replace(rounds[0], seconds=statistics.median(o.seconds for o in rounds))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--latency-ms", type=float, default=2.5)
    parser.add_argument("--repeat", type=int, default=1, help="rounds per contender (median)")
    parser.add_argument("--timeout", type=float, default=180.0, help="per contender")
    parser.add_argument("--contenders", default="", help="comma-separated names (default: all)")
    args = parser.parse_args()
    wanted = [n.strip() for n in args.contenders.split(",") if n.strip()]
    chosen = [c for c in CONTENDERS if not wanted or c.name in wanted]
    if not chosen:
        parser.error(f"no contender among {[c.name for c in CONTENDERS]}")

    from shardflow.local import KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    with KinesaliteServer() as kinesalite, MotoServer() as moto:
        os.environ["AWS_ENDPOINT_URL_KINESIS"] = kinesalite.endpoint_url
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = moto.endpoint_url
        os.environ["AWS_ENDPOINT_URL_DYNAMODB_STREAMS"] = moto.endpoint_url
        preload(kinesalite.endpoint_url, args.records, args.keys)
        print(f"preloaded {args.records:,} records", flush=True)
        outcomes = asyncio.run(run_all(args, chosen))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    payload: dict[str, Any] = {
        "benchmark": "parallel",
        "args": vars(args),
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": machine,
        "order": "order rotated each round",
        "outcomes": [
            asdict(o) | {"records_per_second": o.records_per_second, "verified": o.verified}
            for o in outcomes
        ],
    }
    print("\n" + render(payload))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "parallel.json").write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
