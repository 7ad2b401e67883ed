"""The Foundation demo (``python examples/demo --foundation``): a record's path without Spark.

local stack up -> create a stream -> produce realistic orders and payments (KPL-aggregated,
per-customer order kept) -> read every shard back -> verify each event arrived exactly once and
in per-customer order -> print a summary -> stack down.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter, defaultdict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from demo.events import Event, generate_events
from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import wait_for_active
from shardflow.local import LocalStack
from shardflow.producer import Producer, ProducerSettings
from shardflow.reader import read_all

console = Console(stderr=False)


async def run(events: int, shards: int, endpoint: str) -> bool:
    aws = AwsSettings(endpoint_url=endpoint, region="us-east-1")
    stream = "demo-orders"
    async with ClientFactory(aws).kinesis() as kinesis:
        await kinesis.create_stream(StreamName=stream, ShardCount=shards)
        await wait_for_active(kinesis, stream)
    console.print(f"[bold]2.[/] created stream [cyan]{stream}[/] with {shards} shards")

    produced: list[Event] = list(generate_events(events))
    settings = ProducerSettings(aggregate=True, preserve_key_order=True)
    started = time.perf_counter()
    with Progress(
        TextColumn("[bold]3.[/] producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("produce", total=len(produced))
        async with Producer(stream, settings=settings, aws=aws) as producer:
            futures = []
            for event in produced:
                future = await producer.put(event.to_bytes(), event.partition_key)
                future.add_done_callback(lambda _f: progress.advance(task))
                futures.append(future)
            await producer.flush()
            results = [f.result() for f in futures]
            metrics = producer.metrics()
    produce_seconds = time.perf_counter() - started
    kinesis_records = len({(r.shard_id, r.sequence_number) for r in results})

    started = time.perf_counter()
    records = await read_all(stream, aws=aws)
    read_seconds = time.perf_counter() - started
    console.print(
        f"[bold]4.[/] read back {len(records):,} events from {kinesis_records:,} Kinesis records "
        f"in {read_seconds:.1f}s"
    )
    return verify(produced, records, results, produce_seconds, metrics.put_records_calls)


def verify(
    produced: list[Event],
    records: list,  # type: ignore[type-arg]
    results: list,  # type: ignore[type-arg]
    produce_seconds: float,
    put_calls: int,
) -> bool:
    sent_ids = [e.body["event_id"] for e in produced]
    bodies = [json.loads(r.data) for r in records]
    got = Counter(b["event_id"] for b in bodies)
    missing = [i for i in sent_ids if got[i] == 0]
    duplicated = [i for i, n in got.items() if n > 1]
    unexpected = set(got) - set(sent_ids)

    # Per-customer order: within each customer, events must come back in the order produced.
    sent_order: dict[str, list[str]] = defaultdict(list)
    for event in produced:
        sent_order[event.partition_key].append(event.body["event_id"])
    got_order: dict[str, list[str]] = defaultdict(list)
    for body in bodies:
        got_order[body["customer_id"]].append(body["event_id"])
    out_of_order = [c for c in sent_order if got_order[c] != sent_order[c]]

    table = Table(title="shardflow demo: orders and payments through Kinesis (local stack)")
    table.add_column("check")
    table.add_column("result", justify="right")
    table.add_row("events produced", f"{len(produced):,}")
    table.add_row("events read back", f"{len(bodies):,}")
    table.add_row(
        "missing / duplicated / unexpected",
        f"{len(missing)} / {len(duplicated)} / {len(unexpected)}",
    )
    table.add_row("customers with out-of-order events", f"{len(out_of_order)} of {len(sent_order)}")
    per_shard = Counter(r.shard_id for r in results)
    table.add_row(
        "events per shard", ", ".join(f"{k[-4:]}: {v}" for k, v in sorted(per_shard.items()))
    )
    table.add_row("PutRecords calls", f"{put_calls:,}")
    table.add_row(
        "produce time", f"{produce_seconds:.2f}s ({len(produced) / produce_seconds:,.0f} events/s)"
    )
    revenue: Counter[str] = Counter()
    for body in bodies:
        if body["type"] == "order":
            revenue[body["category"]] += body["amount"]
    table.add_row(
        "revenue by category (EUR)", ", ".join(f"{c} {v:,.0f}" for c, v in revenue.most_common())
    )
    console.print(table)

    ok = not (missing or duplicated or unexpected or out_of_order)
    if ok:
        console.print(
            f"[bold green]verified:[/] all {len(produced):,} events arrived exactly once, "
            "each customer's events in order"
        )
    else:
        console.print("[bold red]verification FAILED[/]")
    return ok


def use_local_credentials(stack: LocalStack) -> None:
    """The demo talks only to the local stack: dummy credentials, never the user's own profile
    (which may not exist, or need an SSO login, on a fresh machine)."""
    for variable in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        os.environ.pop(variable, None)
    os.environ.update(stack.env(current={}))


def main(events: int, shards: int) -> int:
    """Run the Foundation demo; returns the process exit code."""
    console.print("[bold]1.[/] starting the embedded local stack (moto server on 127.0.0.1)")
    with LocalStack(moto=True) as stack:
        endpoint = stack.moto.endpoint_url
        use_local_credentials(stack)
        console.print(f"   moto at {endpoint}")
        ok = asyncio.run(run(events, shards, endpoint))
    console.print("[bold]5.[/] local stack stopped")
    return 0 if ok else 1
