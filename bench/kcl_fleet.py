"""Migrating a running KCL application to shardflow on the same lease table, with the real KCL.

One scenario (``tests/support/kcl/migration.py``) per KCL release: Kinesis on kinesalite (the
KCL through an HTTP/2-cleartext proxy), leases on moto's DynamoDB, records flowing at
``--rate`` per shard per second all the time. Two KCL MultiLangDaemon workers with Python
record processors (checkpoint every 100 records or 2 s, and on shutdown) process the stream;
then, one step at a time:

1. shardflow joins: a shardflow worker starts (a KCL 3.x leader assigns it leases);
2. KCL stops: one KCL worker gets SIGTERM (its graceful shutdown checkpoints);
3. shardflow stops: the shardflow worker gets SIGTERM and hands its leases on.

Every record handled is logged by the process that handled it. Per step: records processed
a second time, each shard's longest time without a handled record; overall: records never
handled. KCL settings are the KCL's defaults (failover 10 s; 3.x: leader assignment every
20 s, balancing every third pass) unless ``--fast-leader`` (assignment every 5 s, balancing
on every pass: the integration test's pace). A release whose package or Java is missing gets
a "not run" row with the reason.

    .venv/bin/python bench/kcl_fleet.py                       # both releases, 8 shards
    .venv/bin/python bench/kcl_fleet.py --short               # KCL 3.x, 4 shards, fast leader
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
FAST_LEADER = {"leaseAssignmentIntervalMillis": "5000", "varianceBalancingFrequency": "1"}


def run_release(args: argparse.Namespace, major: str) -> dict[str, Any]:
    from shardflow.local import KinesaliteServer, MotoServer
    from support.kcl import RELEASES, H2cProxy, KclUnavailable, ensure_installed
    from support.kcl.migration import MigrationScenario

    release = RELEASES[major]
    try:
        install = ensure_installed(release)
    except KclUnavailable as missing:
        print(f"{release.label}: not run: {missing.reason}")
        return {"kcl": release.label, "not_run": missing.reason}
    print(f"{release.label}: {args.shards} shards at {args.rate} records/s each")
    work = Path(tempfile.mkdtemp(prefix=f"kcl-fleet-{major}-"))
    with (
        MotoServer() as moto,
        KinesaliteServer() as kinesalite,
        H2cProxy(kinesalite.endpoint_url) as proxy,
    ):
        scenario = MigrationScenario(
            install,
            kinesis_url=kinesalite.endpoint_url,
            kcl_kinesis_url=proxy.endpoint_url,
            dynamodb_url=moto.endpoint_url,
            work_dir=work,
            shards=args.shards,
            rate=args.rate,
            kcl_properties=FAST_LEADER if args.fast_leader else {},
            step_timeout=args.step_timeout,
        )
        result = scenario.run().as_dict()
    result["kcl_settings"] = (
        "fast leader (5 s, balance every pass)" if args.fast_leader else "KCL defaults"
    )
    return result


def render(result: dict[str, Any]) -> str:
    """The table of bench/results/kcl_fleet.json."""
    lines = [
        "| KCL | step | records processed twice | longest pause of a shard | step done |",
        "|---|---|---:|---:|---|",
    ]
    for run in result["runs"]:
        if "not_run" in run:
            lines.append(f"| {run['kcl']} | not run: {run['not_run']} | | | |")
            continue
        for step in run["steps"]:
            done = "yes" if step["done"] else f"no ({step['note']})"
            lines.append(
                f"| {run['kcl']} | {step['name']} | {step['duplicates']:,} | "
                f"{step['longest_gap']:.1f} s | {done} |"
            )
        lines.append(
            f"| {run['kcl']} | whole run: {run['written']:,} records, {run['lost']} never handled "
            f"| {run['duplicates']:,} | | |"
        )
    first = next((run for run in result["runs"] if "not_run" not in run), None)
    if first is not None:
        lines.append("")
        lines.append(
            f"{first['shards']} shards at {first['rate_per_shard']} records/s each, failover "
            f"{first['failover_seconds']:g} s, {first['kcl_settings']}; {result['machine']}."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--releases", default="3,2", help="KCL major versions, e.g. 3 or 3,2")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rate", type=int, default=50, help="records/s per shard")
    parser.add_argument("--fast-leader", action="store_true")
    parser.add_argument("--step-timeout", type=float, default=240.0)
    parser.add_argument("--short", action="store_true", help="KCL 3.x, 4 shards, fast leader")
    args = parser.parse_args()
    if args.short:
        args.releases, args.shards, args.rate, args.fast_leader = "3", 4, 20, True
        args.step_timeout = 120.0
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    runs = [run_release(args, major.strip()) for major in args.releases.split(",")]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {
        "bench": "kcl_fleet",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kcl_fleet.json").write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))


if __name__ == "__main__":
    main()
