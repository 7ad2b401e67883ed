"""bench/multilang_memory.py: where ``shardflow multilang``'s daemon memory goes, in-process.

No server, no child process, a few seconds: the parts of the daemon's footprint that do not
depend on a drain's timing, each measured rather than guessed.

- imports: RSS (``/proc/self/status``) after importing what the daemon needs, group by group
  (each row: what that group adds over the rows above it);
- clients: live Python memory (tracemalloc) and RSS after opening the Kinesis, DynamoDB and
  DynamoDB Streams clients the daemon opens (botocore's service models and endpoint data);
- records: live bytes per delivered record (100 B of data, as bench/multilang.py writes them),
  times the records one shard may hold (``prefetch_records``: the next GetRecords waits for
  room);
- one ``processRecords`` batch of ``maxRecords`` records: the peak while it is encoded whole
  (one line) and in the pieces the daemon writes.

bench/multilang.py gives the daemon's and processors' RSS at the end of a real drain; this says
what that RSS is made of. Prints only (no JSON, no table).
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from datetime import UTC, datetime
from typing import Any

MIB = 1024 * 1024
RECORDS = 10_000  # maxRecords' default: one GetRecords batch, one processRecords line


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def imports() -> list[tuple[str, float]]:
    rows, before = [], rss_mib()
    rows.append(("interpreter", before))
    groups = [
        ("asyncio (with ssl)", ["asyncio", "ssl"]),
        ("aiohttp", ["aiohttp"]),
        ("botocore + aiobotocore", ["botocore.session", "aiobotocore.session"]),
        ("orjson", ["orjson"]),
        ("prometheus_client, hdrh", ["prometheus_client", "hdrh.histogram"]),
        ("shardflow.consumer (and below)", ["shardflow.consumer"]),
        # What `shardflow multilang -p FILE` imports: its start without typer, not shardflow.cli.
        ("shardflow.multilang + its start", ["shardflow.cli.multilang_run"]),
    ]
    for name, modules in groups:
        for module in modules:
            __import__(module)
        gc.collect()
        now = rss_mib()
        rows.append((name, now - before))
        before = now
    return rows


def clients() -> tuple[float, float]:
    """RSS added by the daemon's three clients (untraced: tracing costs memory of its own),
    then the live memory of another factory's three (traced)."""
    import asyncio

    from shardflow.aws.clients import ClientFactory
    from shardflow.aws.settings import AwsSettings

    async def opened() -> float:
        factory = ClientFactory(AwsSettings(region="us-east-1", endpoint_url="http://127.0.0.1:9"))
        gc.collect()
        rss, traced = rss_mib(), tracemalloc.get_traced_memory()[0]
        async with factory.kinesis(), factory.dynamodb(), factory.dynamodbstreams():
            gc.collect()
            if tracemalloc.is_tracing():
                return (tracemalloc.get_traced_memory()[0] - traced) / MIB
            return rss_mib() - rss

    rss = asyncio.run(opened())
    tracemalloc.start()
    return asyncio.run(opened()), rss


def records() -> list[Any]:
    from shardflow.consumer.checkpointing.acks import build_undelivered
    from shardflow.fetch.batch import records_from_kinesis

    arrival = datetime.now(UTC)
    raws = [
        {
            "Data": (f"{i:010d}|" + "x" * 89).encode(),
            "PartitionKey": f"pk-{i % 10_007}",
            "SequenceNumber": str(49668 * 10**51 + i * 1000),
            "ApproximateArrivalTimestamp": arrival.replace(microsecond=i % 1000),
        }
        for i in range(RECORDS)
    ]
    built: list[Any] = records_from_kinesis(
        raws, shard_id="shardId-000000000000", stream_name="s", build=build_undelivered
    )
    return built


def peak_of(make: Any) -> float:
    gc.collect()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    make()
    return (tracemalloc.get_traced_memory()[1] - before) / MIB


def main() -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    for name, mib in imports():
        print(f"import  {name:34s} {mib:6.1f} MiB RSS")
    from shardflow.multilang import config, messages

    live, rss = clients()  # tracing from here on
    print(f"clients kinesis + dynamodb + streams   {live:6.1f} MiB live, {rss:6.1f} MiB RSS")

    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    batch = records()
    gc.collect()
    per_record = (tracemalloc.get_traced_memory()[0] - before) / RECORDS
    held = max(2 * config.KCL_MAX_RECORDS, 1_000)  # MultiLangConfig.consumer_settings
    print(
        f"records {per_record:.0f} B live per record; a shard holds up to {held:,} "
        f"(the batch with its processor and the next; the one after is asked for only once "
        f"the first is released): {held * per_record / MIB:.1f} MiB"
    )
    whole = peak_of(lambda: messages.process_records(batch, 0))

    def pieces() -> None:
        for _ in messages.process_records_pieces(batch, 0):
            pass  # written and dropped one by one, as the daemon does

    print(
        f"batch   processRecords of {RECORDS:,}: {whole:.1f} MiB peak as one line, "
        f"{peak_of(pieces):.1f} MiB in pieces of {messages.RECORDS_PER_PIECE}"
    )
    left_out = [name for name in ("typer", "click", "rich", "pydantic", "google.protobuf")]
    loaded = [name for name in left_out if name in sys.modules]
    print(f"not imported on the daemon's path: {', '.join(n for n in left_out if n not in loaded)}")
    if loaded:
        print(f"imported although the daemon does not need them: {', '.join(loaded)}")
    print(f"python  {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
