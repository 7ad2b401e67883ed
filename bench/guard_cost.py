"""The DynamoDB idempotency guard's cost per record, one write at a time against batched.

Each round claims, "handles" (1 ms) and completes ``--records`` keys with ``--concurrency``
of them in flight (as the dispatcher runs many records of a shard at once), through a fault
proxy that holds every DynamoDB request 5-10 ms (the real service's latency), on a fresh
table on moto's server. Measured per mode: records/s and DynamoDB requests per record (what
reached moto, counted by the proxy). Modes alternate within each round; medians over
``--rounds``.

    .venv/bin/python bench/guard_cost.py        # bench/results/guard_cost.json

Tables are kept small (a fresh one per round and mode): moto's TransactWriteItems copies the
whole table for each item of a transaction (``moto/dynamodb/models``), so on moto a batched
claim's cost grows with the table; DynamoDB has no such cost. Write units are not measured
(moto has none): by DynamoDB's pricing a single conditional put is 1 write unit and a
transactional one 2, so the guard costs 2 write units per record one at a time and 3 batched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODES = ("one at a time", "batched")


async def one_round(
    endpoint: str, proxy: Any, batch: bool, records: int, concurrency: int
) -> dict[str, float]:
    from shardflow.aws import AwsSettings, ClientFactory
    from shardflow.idempotency import DynamoDBIdempotencyGuard

    table = f"guard-cost-{uuid.uuid4().hex[:8]}"
    settings = AwsSettings(
        endpoint_url=endpoint, region="us-east-1", max_pool_connections=concurrency
    )
    factory = ClientFactory(settings)
    async with DynamoDBIdempotencyGuard.connect(factory, table, batch=batch) as guard:
        before = proxy.forwarded_to(table)
        keys = iter(range(records))
        claimed = 0

        async def worker() -> None:
            nonlocal claimed
            for i in keys:
                claim = await guard.claim(f"stream/shard/{i}/0")
                if claim.claimed:
                    claimed += 1
                    await asyncio.sleep(0.001)  # the handler
                    await guard.complete(claim)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = time.perf_counter() - began
        requests = proxy.forwarded_to(table) - before
    if claimed != records:
        raise RuntimeError(f"{claimed} of {records} keys claimed on a fresh table")
    return {"records_per_second": records / took, "requests_per_record": requests / records}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from shardflow.local import MotoServer
    from shardflow.testing.faults import FaultProxy

    commit = source_commit()  # at the start: the code this run runs
    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with MotoServer() as moto, FaultProxy(moto.endpoint_url, seed=args.seed) as proxy:
        proxy.set_latency(args.latency[0] / 1000, args.latency[1] / 1000, service="DynamoDB")
        for round_ in range(args.rounds):
            order = MODES if round_ % 2 == 0 else MODES[::-1]
            for mode in order:
                got = asyncio.run(
                    one_round(proxy.url, proxy, mode == "batched", args.records, args.concurrency)
                )
                samples[mode].append(got)
                print(
                    f"  round {round_ + 1} {mode}: {got['records_per_second']:.0f} records/s, "
                    f"{got['requests_per_record']:.3f} requests/record",
                    flush=True,
                )
    rows = []
    for mode in MODES:
        rates = [s["records_per_second"] for s in samples[mode]]
        requests = [s["requests_per_record"] for s in samples[mode]]
        rows.append(
            {
                "mode": mode,
                "records_per_second": round(statistics.median(rates), 1),
                "records_per_second_rounds": [round(r, 1) for r in rates],
                "requests_per_record": round(statistics.median(requests), 4),
                "write_units_per_record": 2 if mode == "one at a time" else 3,
            }
        )
    return {
        "benchmark": "guard_cost",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "records": args.records,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "latency_ms": f"{args.latency[0]:g}-{args.latency[1]:g}",
        "results": rows,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "commit": commit,
    }


def source_commit() -> str:
    sys.path.insert(0, str(HERE))
    from chaos import source_commit as commit

    return commit()


def render(result: dict[str, Any]) -> str:
    rows = {r["mode"]: r for r in result["results"]}
    single, batched = rows["one at a time"], rows["batched"]
    lines = [
        "| guard | records/s | DynamoDB requests per record | write units per record |",
        "|---|---:|---:|---:|",
    ]
    for row in (single, batched):
        lines.append(
            f"| {row['mode']} | {row['records_per_second']:,.0f} | "
            f"{row['requests_per_record']:.3f} | {row['write_units_per_record']} |"
        )
    gain = batched["records_per_second"] / single["records_per_second"]
    lines.append("")
    lines.append(
        f"(batched: {gain:.1f}x the records/s; {result['records']:,} records per round, "
        f"{result['concurrency']} in flight, a handler of 1 ms, DynamoDB latency "
        f"{result['latency_ms']} ms added by the fault proxy, a fresh table on moto per round, "
        f"median of {result['rounds']} rounds; write units by DynamoDB's pricing, not "
        f"measured; {result['machine']}; commit {result['commit']})"
    )
    return "\n".join(lines)


def _milliseconds(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=_milliseconds, default=(5.0, 10.0))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--results", help="JSON path (default bench/results/guard_cost.json)")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "guard-cost")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "guard-cost")
    result = measure(args)
    text = render(result)
    print("\n" + text)
    result["table"] = text
    path = Path(args.results) if args.results else RESULTS / "guard_cost.json"
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
