"""Producer throughput and CPU cost: shardflow vs a plain boto3 loop (the floor) vs aiokpl (a peer).

Every contender runs in a child process of its own, so its CPU-seconds are its own; all write the
same records (unique ids) into a fresh 4-shard stream on kinesalite, whose write speed holds as a
stream fills. After each run the stream is read back in full and every id is checked, so a
contender that drops records cannot post a number.

    .venv/bin/python bench/producer.py              # 200,000 x 100 B, all contenders
    .venv/bin/python bench/producer.py --records 20000 --contenders boto3,shardflow
    .venv/bin/python bench/producer.py --repeat 3 --baseline a13a9ba   # + that commit's shardflow

``--baseline REF`` adds a row "shardflow @REF": the "shardflow" row again with the producer of an
earlier commit (its src/ taken with ``git archive``), in the same run, each round beside the
others: whether a change made the producer dearer is read from two rows of one run, not from two
runs on a shared machine whose garbage-collector timing moves the ratio by a tenth.

Per-shard rate limits: kinesalite enforces none, and shardflow and aiokpl both limit themselves to
Kinesis' 1,000 records/s per shard by default, which would make every contender look the same
(4,000 records/s on 4 shards). The main rows lift the limits of both libraries to compare the
pipelines themselves; the "+ limits" rows keep AWS's limits to show what a real stream allows.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# make bench (the short mode) writes elsewhere: only full runs are the docs' figures.
RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
UNLIMITED = 1e12


@dataclass
class Outcome:
    contender: str
    records: int
    seconds: float
    cpu_seconds: float
    verified: int
    duplicates: int
    missing: int

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_per_100k(self) -> float:
        return self.cpu_seconds * 100_000 / self.records


def payloads(count: int, size: int) -> list[tuple[str, bytes]]:
    """(partition key, payload) pairs; each payload starts with a unique id."""
    out = []
    for i in range(count):
        head = f"{i:010d}|".encode()
        out.append((f"pk-{i % 10_007}", head + b"x" * max(0, size - len(head))))
    return out


# --- contenders (run inside the child process) ------------------------------------------------


def run_boto3(endpoint: str, stream: str, items: list[tuple[str, bytes]]) -> None:
    """The floor: the loop people write by hand, with the retry of failed entries they forget."""
    import boto3

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1")
    for start in range(0, len(items), 500):
        entries = [{"Data": d, "PartitionKey": k} for k, d in items[start : start + 500]]
        while entries:
            response = client.put_records(StreamName=stream, Records=entries)
            entries = [
                entry
                for entry, result in zip(entries, response["Records"], strict=True)
                if "ErrorCode" in result
            ]


def run_aiokpl(
    endpoint: str, stream: str, items: list[tuple[str, bytes]], aggregate: bool, limits: bool
) -> None:
    import aiokpl

    async def main() -> None:
        rate: dict[str, float] = (
            {}
            if limits
            else {
                "rate_limit_records_per_sec_per_shard": UNLIMITED,
                "rate_limit_bytes_per_sec_per_shard": UNLIMITED,
            }
        )
        config = aiokpl.Config(
            region="us-east-1", endpoint_url=endpoint, aggregation_enabled=aggregate, **rate
        )
        async with aiokpl.Producer(config) as producer:
            outcomes = [
                await producer.put_record(stream=stream, partition_key=k, data=d) for k, d in items
            ]
            await producer.flush()
            for outcome in outcomes:
                result = await outcome.wait()
                if not result.success:
                    raise RuntimeError(f"aiokpl failed a record: {result}")

    asyncio.run(main())


def run_shardflow(
    endpoint: str,
    stream: str,
    items: list[tuple[str, bytes]],
    aggregate: bool,
    limits: bool,
    collector: bool = True,
    cloudwatch: bool = False,
) -> None:
    import gc

    from shardflow.aws import AwsSettings
    from shardflow.producer import Producer, ProducerSettings

    async def main() -> None:
        rate: dict[str, Any] = (
            {}
            if limits
            else {"shard_records_per_second": UNLIMITED, "shard_bytes_per_second": UNLIMITED}
        )
        # The KPL's CloudWatch metrics, collected every second (60 times the default, an upper
        # bound of their cost) and sent to the Kinesis emulator, which refuses them: the sends
        # fail and are dropped, as in a CloudWatch outage.
        if cloudwatch:
            # Imported and passed only here: a --baseline commit may predate them.
            from shardflow.metrics.cloudwatch import CloudWatch

            rate["metrics"] = CloudWatch(interval=1.0, endpoint_url=endpoint)
        settings = ProducerSettings(aggregate=aggregate, **rate)
        aws = AwsSettings(endpoint_url=endpoint, region="us-east-1")
        async with Producer(stream, settings=settings, aws=aws) as producer:
            # Every record's result is checked, as it arrives, and not kept after (as the
            # boto3 loop checks each response and keeps nothing): a list of every future
            # would be the garbage collector's work, not the producer's.
            waiting: deque[asyncio.Future[Any]] = deque()
            for key, data in items:
                waiting.append(await producer.put(data, key))
                while waiting and waiting[0].done():
                    waiting.popleft().result()
            await producer.flush()
            for future in waiting:
                future.result()

    if not collector:
        # Not a setting anyone should copy: this row shows how much of the row above is
        # CPython's cyclic collector walking the futures in flight.
        gc.disable()
    asyncio.run(main())


CONTENDERS: dict[str, Callable[[str, str, list[tuple[str, bytes]]], None]] = {
    "boto3 put_records loop": run_boto3,
    "aiokpl": lambda e, s, i: run_aiokpl(e, s, i, aggregate=False, limits=False),
    "aiokpl (aggregated)": lambda e, s, i: run_aiokpl(e, s, i, aggregate=True, limits=False),
    "shardflow": lambda e, s, i: run_shardflow(e, s, i, aggregate=False, limits=False),
    "shardflow (collector off)": lambda e, s, i: run_shardflow(
        e, s, i, aggregate=False, limits=False, collector=False
    ),
    "shardflow + CloudWatch metrics": lambda e, s, i: run_shardflow(
        e, s, i, aggregate=False, limits=False, cloudwatch=True
    ),
    "shardflow (aggregated)": lambda e, s, i: run_shardflow(e, s, i, aggregate=True, limits=False),
    "shardflow (aggregated) + limits": lambda e, s, i: run_shardflow(
        e, s, i, aggregate=True, limits=True
    ),
}


# What each contender imports, imported before the clock starts (as bench/consumer.py does):
# the figure is CPU per record, not an interpreter's start-up.
IMPORTS = {
    "boto3": ("boto3",),
    "aiokpl": ("aiokpl",),
    "shardflow": ("shardflow.producer", "shardflow.aws", "aiobotocore.session"),
}


def child(args: argparse.Namespace) -> None:
    items = payloads(args.records, args.size)
    for module in IMPORTS[args.child.split()[0]]:
        importlib.import_module(module)
    cpu0, t0 = time.process_time(), time.perf_counter()
    CONTENDERS[args.child](args.endpoint, args.stream, items)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu}))


# --- parent: servers, streams, verification, table --------------------------------------------


def verify(endpoint: str, stream: str, expected: int) -> tuple[int, int, int]:
    """(distinct ids found, duplicates, missing) after reading the whole stream back."""
    from shardflow.aws import AwsSettings
    from shardflow.reader import read_all

    records = asyncio.run(
        read_all(stream, aws=AwsSettings(endpoint_url=endpoint, region="us-east-1"))
    )
    ids = [int(r.data.split(b"|", 1)[0]) for r in records]
    distinct = set(ids)
    missing = expected - len(distinct & set(range(expected)))
    return len(distinct), len(ids) - len(distinct), missing


def create_stream(endpoint: str, stream: str, shards: int) -> None:
    import boto3

    client = boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1")
    client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
    )


BASELINE_PREFIX = "shardflow @"


def baseline_source(ref: str, into: Path) -> tuple[str, Path]:
    """``src/`` of commit ``ref`` unpacked under ``into``: (the commit's short name, the dir)."""
    root = Path(__file__).resolve().parent.parent
    short = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", ref],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", short, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return short, into / "src"


def parent(args: argparse.Namespace) -> None:
    import tempfile

    from shardflow.local import KinesaliteServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    chosen = [c for c in CONTENDERS if not args.contenders or c in args.contenders.split(",")]
    scratch = tempfile.TemporaryDirectory(prefix="shardflow-baseline-")
    baseline_src: Path | None = None
    if args.baseline:
        short, baseline_src = baseline_source(args.baseline, Path(scratch.name))
        chosen.append(BASELINE_PREFIX + short)
    runs: dict[str, list[Outcome]] = {name: [] for name in chosen}
    with KinesaliteServer() as kinesalite:
        endpoint = kinesalite.endpoint_url
        # Round-robin over the contenders, the order rotated each round, so that a noisy spell
        # of the shared machine (or going first) does not fall on one contender only.
        for round_ in range(args.repeat):
            turn = round_ % len(chosen)
            for name in chosen[turn:] + chosen[:turn]:
                n = chosen.index(name)
                stream = f"bench-producer-{round_}-{n}"
                create_stream(endpoint, stream, args.shards)
                env = None
                runner = name
                if name.startswith(BASELINE_PREFIX):
                    # The shardflow row, importing the baseline commit's package first.
                    env = dict(os.environ, PYTHONPATH=str(baseline_src))
                    runner = "shardflow"
                command = [
                    sys.executable,
                    __file__,
                    "--child",
                    runner,
                    "--endpoint",
                    endpoint,
                    "--stream",
                    stream,
                    "--records",
                    str(args.records),
                    "--size",
                    str(args.size),
                ]
                done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
                measured = json.loads(done.stdout.strip().splitlines()[-1])
                found, duplicates, missing = verify(endpoint, stream, args.records)
                outcome = Outcome(
                    name,
                    args.records,
                    measured["seconds"],
                    measured["cpu_seconds"],
                    found,
                    duplicates,
                    missing,
                )
                runs[name].append(outcome)
                print(
                    f"round {round_ + 1}: {name:34s} {outcome.records_per_second:10,.0f} rec/s  "
                    f"{outcome.cpu_per_100k:6.2f} CPU-s/100k  verified {found:,} "
                    f"(dup {duplicates}, missing {missing})",
                    flush=True,
                )
    scratch.cleanup()
    outcomes = [median_outcome(runs[name]) for name in chosen]
    report(outcomes, args)


def median_outcome(outcomes: list[Outcome]) -> Outcome:
    """Medians of the rounds' wall and CPU seconds (of two rounds: their mean); the worst
    verification of any round."""
    first = outcomes[0]
    return Outcome(
        first.contender,
        first.records,
        statistics.median(o.seconds for o in outcomes),
        statistics.median(o.cpu_seconds for o in outcomes),
        min(o.verified for o in outcomes),
        max(o.duplicates for o in outcomes),
        max(o.missing for o in outcomes),
    )


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def report(outcomes: list[Outcome], args: argparse.Namespace) -> None:
    payload = {
        "benchmark": "producer",
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": machine(),
        "args": vars(args),
        "results": [
            asdict(o) | {"records_per_second": o.records_per_second, "cpu_per_100k": o.cpu_per_100k}
            for o in outcomes
        ],
    }
    print("\n" + render(payload))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "producer.json").write_text(json.dumps(payload, indent=2) + "\n")


def outcomes_of(result: dict[str, Any]) -> list[Outcome]:
    names = [f.name for f in fields(Outcome)]
    return [Outcome(**{k: r[k] for k in names}) for r in result["results"]]


def render(result: dict[str, Any]) -> str:
    """The table of one run, from its JSON (bench/tables.py puts it into the docs)."""
    args = result["args"]
    outcomes = outcomes_of(result)
    base = next((o for o in outcomes if o.contender.startswith("boto3")), outcomes[0])
    lines = [
        f"{args['records']:,} records x {args['size']} B into {args['shards']} shards on "
        f"kinesalite, median of {args['repeat']} round(s), order rotated each round "
        f"({result['machine']})",
        "",
        "| producer | records/s | vs boto3 loop | CPU-s per 100k | vs boto3 loop | verified |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.contender} | {o.records_per_second:,.0f} | "
            f"{o.records_per_second / base.records_per_second:.2f}x | {o.cpu_per_100k:.2f} | "
            f"{o.cpu_per_100k / base.cpu_per_100k:.2f}x | "
            f"{'all' if o.missing == 0 else f'{o.missing} MISSING'} |"
        )
    lines += [
        "",
        "CPU-seconds of each contender's own process from its first record to its last result "
        "(its modules imported before the clock); every contender checks every record's result "
        "(shardflow's as each arrives, keeping none after); the stream is read back and every id "
        "verified.",
    ]
    for o in outcomes:
        if o.contender.startswith(BASELINE_PREFIX):
            lines += [
                "",
                f"{o.contender}: the shardflow row again with the producer of commit "
                f"{o.contender.removeprefix(BASELINE_PREFIX)}, run in the same rounds: "
                f"{o.cpu_per_100k:.2f} against {_row(outcomes, 'shardflow')} CPU-s per 100k.",
            ]
    if any(o.contender.endswith("(collector off)") for o in outcomes):
        lines += [
            "",
            "shardflow (collector off): the shardflow row again with CPython's cyclic garbage "
            "collector disabled in its process, to show the collector's share of that row (every "
            "future in flight is an object it walks); not a setting to copy.",
        ]
    return "\n".join(lines)


def _row(outcomes: list[Outcome], contender: str) -> str:
    found = [o for o in outcomes if o.contender == contender]
    return f"{found[0].cpu_per_100k:.2f}" if found else "(no row)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="rounds; the table shows medians")
    parser.add_argument("--contenders", default="", help="comma-separated names (default: all)")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run the shardflow row with the producer of this git commit, in the same run",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
