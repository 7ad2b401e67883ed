"""CPU of one idle call: an empty GetRecords and a lease renewal, per layer of shardflow's path.

An idle consumer's cost is its calls that find nothing: every idle shard's GetRecords (one per
``max_idle_time`` once backed off) and, in the per-lease mode, every lease's conditional
UpdateItem (one per renew interval: ~300 a second at 1,000 leases). This bench measures the
CPU-seconds of 1,000 such calls in this process (the emulators run in their own processes,
their CPU is not counted), for each layer of the path a consumer takes:

- GetRecords of an empty shard on kinesalite: ``plain`` (an aiobotocore client with nothing
  configured: the baseline), ``validated`` (shardflow's client with botocore's parameter
  validation of every call, as before shardflow skipped it for its own requests: ``Config(
  parameter_validation=True)``), ``client`` (the client shardflow's ``ClientFactory`` makes),
  ``fetcher`` (a ``PollingFetcher`` on that client, ``idle_time`` 0: the fetch path, its call
  limiter, backoff bookkeeping and batch building included).
- A lease renewal on dynalite: ``plain`` (the same conditional UpdateItem through a plain
  client), ``validated`` and ``client`` (through shardflow's client, as above), ``store`` (``DynamoDBLeaseStore.renew``:
  the write rendered, sent and its answer read into a ``Lease``).

Calls are made the way an idle consumer makes them: ``--concurrency`` shards (leases) at once,
each one call after the other. Each round measures every variant once, in an order rotated
from round to round; the figures are medians of the rounds, and each variant's ratio to
``plain`` is the median of the ratios measured in the same round.

    .venv/bin/python bench/client_calls.py                     # 5 rounds of 2,000 calls each
    .venv/bin/python bench/client_calls.py --rounds 1 --calls 500
    .venv/bin/python bench/client_calls.py --only getrecords:client --calls 20000  # profile it
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
REGION = "us-east-1"
STREAM = "bench-client-calls"
OWNER = "bench-worker"
WARM_UP = 20  # calls per variant before each measurement (connections open, caches filled)

GETRECORDS = ("plain", "validated", "client", "fetcher")
RENEWAL = ("plain", "validated", "client", "store")

Call = Callable[[int], Awaitable[None]]
"""One call on behalf of task ``i`` (a shard, a lease)."""


async def measure(call: Call, tasks: int, calls: int) -> float:
    """CPU-seconds per 1,000 calls: ``calls`` in all, ``tasks`` at once, each one after the
    other."""
    each = max(1, calls // tasks)

    async def run(i: int, n: int) -> None:
        for _ in range(n):
            await call(i)

    await asyncio.gather(*(run(i, max(1, WARM_UP // tasks)) for i in range(tasks)))
    cpu = time.process_time()
    await asyncio.gather(*(run(i, each) for i in range(tasks)))
    return (time.process_time() - cpu) / (each * tasks) * 1000


class GetRecordsCalls:
    """Empty GetRecords calls on ``shards`` shards, one iterator per shard and variant."""

    def __init__(self, clients: dict[str, Any], shard_ids: list[str]) -> None:
        self.clients = clients
        self.shard_ids = shard_ids
        self.iterators: dict[tuple[str, int], str] = {}
        self.fetchers: dict[int, Any] = {}

    async def prepare(self) -> None:
        for name, kinesis in self.clients.items():
            for i, shard_id in enumerate(self.shard_ids):
                answer = await kinesis.get_shard_iterator(
                    StreamName=STREAM, ShardId=shard_id, ShardIteratorType="LATEST"
                )
                self.iterators[(name, i)] = answer["ShardIterator"]
        from shardflow.fetch.polling import Polling, PollingFetcher
        from shardflow.positions import StartPosition

        # idle_time 0: the next call at once (the per-shard limit of 5 a second still holds).
        polling = Polling(idle_time=0.0)
        for i, shard_id in enumerate(self.shard_ids):
            self.fetchers[i] = PollingFetcher(
                self.clients["client"], STREAM, shard_id, StartPosition.latest(), polling
            )

    def call(self, variant: str) -> Call:
        if variant == "fetcher":

            async def fetch(i: int) -> None:
                batch = await anext(self.fetchers[i])
                if batch.records:
                    raise RuntimeError("the bench's shards must stay empty")

            return fetch
        kinesis = self.clients[variant]

        async def get_records(i: int) -> None:
            answer = await kinesis.get_records(
                ShardIterator=self.iterators[(variant, i)], Limit=10_000
            )
            if answer["Records"]:
                raise RuntimeError("the bench's shards must stay empty")
            self.iterators[(variant, i)] = answer["NextShardIterator"]

        return get_records


class RenewalCalls:
    """Conditional renewals of ``leases`` leases (owner and counter checked, counter bumped)."""

    def __init__(self, clients: dict[str, Any], leases: int, application: str) -> None:
        from shardflow.leases import DynamoDBLeaseStore

        self.clients = clients
        self.store = DynamoDBLeaseStore(clients["client"], application)
        self.count = leases
        self.leases: list[Any] = []

    async def prepare(self) -> None:
        from shardflow.leases.model import Lease

        await self.store.ensure_table()
        for i in range(self.count):
            lease = await self.store.create_if_absent(Lease(lease_key=f"shardId-{i:012d}"))
            self.leases.append(await self.store.take(lease, OWNER))

    def call(self, variant: str) -> Call:
        if variant == "store":

            async def renew(i: int) -> None:
                self.leases[i] = await self.store.renew(self.leases[i], OWNER)

            return renew
        from shardflow.leases import writes
        from shardflow.leases.dynamodb import render
        from shardflow.leases.model import key_of, lease_from_item

        dynamodb = self.clients[variant]

        async def update_item(i: int) -> None:
            # The request DynamoDBLeaseStore.renew sends, built and read by hand.
            write = writes.renew(self.leases[i], OWNER)
            answer = await dynamodb.update_item(
                TableName=self.store.table_name,
                Key=key_of(write.lease_key),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **render(write.conditions, write.actions),
            )
            self.leases[i] = lease_from_item(answer["Attributes"])

        return update_item


def plain_client(session: Any, service: str, endpoint: str) -> Any:
    """An aiobotocore client with nothing configured but where it goes."""
    return session.create_client(service, region_name=REGION, endpoint_url=endpoint)


async def run(args: argparse.Namespace, kinesis_url: str, dynamodb_url: str) -> dict[str, Any]:
    from aiobotocore.session import get_session
    from botocore.config import Config

    from shardflow.aws import AwsSettings, ClientFactory

    os.environ["AWS_ENDPOINT_URL_KINESIS"] = kinesis_url
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb_url
    # As a consumer builds them: endpoints from the environment (bench/consumer.py does too).
    factory = ClientFactory(AwsSettings(region=REGION))
    every_call = Config(parameter_validation=True)
    validating = ClientFactory(AwsSettings(region=REGION, botocore_config=every_call))
    session = get_session()
    async with (
        factory.kinesis(own_requests=True) as kinesis,
        factory.dynamodb(own_requests=True) as dynamodb,
        validating.kinesis(own_requests=True) as validated_kinesis,
        validating.dynamodb(own_requests=True) as validated_dynamodb,
        plain_client(session, "kinesis", kinesis_url) as plain_kinesis,
        plain_client(session, "dynamodb", dynamodb_url) as plain_dynamodb,
    ):
        await kinesis.create_stream(StreamName=STREAM, ShardCount=args.concurrency)
        for _ in range(600):
            summary = await kinesis.describe_stream_summary(StreamName=STREAM)
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            await asyncio.sleep(0.1)
        listed = await kinesis.list_shards(StreamName=STREAM)
        shard_ids = [shard["ShardId"] for shard in listed["Shards"]]
        suites: dict[str, Any] = {
            "getrecords": GetRecordsCalls(
                {"plain": plain_kinesis, "validated": validated_kinesis, "client": kinesis},
                shard_ids,
            ),
            "renewal": RenewalCalls(
                {"plain": plain_dynamodb, "validated": validated_dynamodb, "client": dynamodb},
                args.concurrency,
                f"bench-calls-{os.getpid()}",
            ),
        }
        for suite in suites.values():
            await suite.prepare()
        variants = [
            (suite, variant)
            for suite, names in (("getrecords", GETRECORDS), ("renewal", RENEWAL))
            for variant in names
        ]
        if args.only:
            variants = [tuple(args.only.split(":", 1))]  # type: ignore[list-item]
        rounds: list[dict[str, float]] = []
        for r in range(args.rounds):
            shift = r % len(variants)
            measured: dict[str, float] = {}
            for suite, variant in variants[shift:] + variants[:shift]:
                call = suites[suite].call(variant)
                measured[f"{suite}:{variant}"] = await measure(call, args.concurrency, args.calls)
            rounds.append(measured)
            print(
                f"round {r + 1}: "
                + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in sorted(measured.items())),
                flush=True,
            )
    return {"rounds": rounds}


def summarize(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per variant: median CPU-seconds per 1,000 calls, and its median ratio to ``plain``."""
    out: dict[str, dict[str, float]] = {}
    for key in rounds[0]:
        suite = key.split(":", 1)[0]
        values = [r[key] for r in rounds]
        entry = {
            "cpu_per_1000": statistics.median(values),
            "low": min(values),
            "high": max(values),
        }
        base = f"{suite}:plain"
        if base in rounds[0]:
            ratios = [r[key] / r[base] for r in rounds]
            entry |= {
                "ratio": statistics.median(ratios),
                "ratio_low": min(ratios),
                "ratio_high": max(ratios),
            }
        out[key] = entry
    return out


LAYERS = {
    "getrecords:plain": "aiobotocore client, nothing configured (baseline)",
    "getrecords:validated": "shardflow's client, every call validated (as before)",
    "getrecords:client": "shardflow's client (ClientFactory)",
    "getrecords:fetcher": "PollingFetcher on it (the fetch path)",
    "renewal:plain": "aiobotocore client, nothing configured (baseline)",
    "renewal:validated": "shardflow's client, every call validated (as before)",
    "renewal:client": "shardflow's client (ClientFactory)",
    "renewal:store": "DynamoDBLeaseStore.renew on it (the lease path)",
}


def render(result: dict[str, Any]) -> str:
    """The table of one run, from its JSON."""
    args = result["args"]
    summary = summarize(result["rounds"])
    lines = [
        "| call | layer | CPU-s per 1,000 calls | x plain client |",
        "|---|---|---|---|",
    ]
    for key, entry in summary.items():
        suite, _ = key.split(":", 1)
        call = "empty GetRecords" if suite == "getrecords" else "lease renewal (UpdateItem)"
        ratio = entry.get("ratio")
        shown = (
            f"{ratio:.2f} ({entry['ratio_low']:.2f}-{entry['ratio_high']:.2f})"
            if ratio is not None
            else "-"
        )
        lines.append(
            f"| {call} | {LAYERS.get(key, key)} | {entry['cpu_per_1000']:.3f} "
            f"({entry['low']:.3f}-{entry['high']:.3f}) | {shown} |"
        )
    lines.append("")
    lines.append(
        f"Medians of {len(result['rounds'])} rounds (their range in brackets), "
        f"{args['calls']:,} calls per variant and round, {args['concurrency']} shards or leases "
        f"at once; Kinesis on kinesalite, the lease table on dynalite; CPU of the calling "
        f"process only (bench/client_calls.py, {result['machine']})."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2_000, help="per variant and round")
    parser.add_argument("--concurrency", type=int, default=50, help="shards (leases) at once")
    parser.add_argument("--only", help="one SUITE:VARIANT (for a profiler); nothing written")
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    from shardflow.local import DynaliteServer, KinesaliteServer

    with (
        KinesaliteServer(shard_limit=args.concurrency + 10) as kinesalite,
        DynaliteServer() as dynalite,
    ):
        measured = asyncio.run(run(args, kinesalite.endpoint_url, dynalite.endpoint_url))
    result = {
        "benchmark": "client_calls",
        "args": vars(args),
        **measured,
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    print("\n" + render(result))
    if args.only:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "client_calls.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
