"""The benchmark tables of README.md and docs/, rendered from bench/results/*.json.

A table sits between two markers, ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; what
is between them is generated, never edited by hand. NAME is a bench script: ``bench/NAME.py``
defines ``render(result) -> str`` and its results are ``bench/results/NAME.json`` (the JSON is
the truth, the script's ``render`` the only way to print it, the same function the bench uses
for its own output); ``NAME.PART`` is another table of the same JSON, ``render_PART(result)``; ``NAME@VARIANT``
renders ``bench/results/NAME-VARIANT.json`` (the same bench run with other parameters, e.g.
``handoff@64``). ``headline`` is the short table of README.md, built here from several
benches' JSON.

    .venv/bin/python bench/tables.py           # rewrite every table from the JSON
    .venv/bin/python bench/tables.py --check   # exit 1 if a table differs from its JSON
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
MARKED = re.compile(
    r"(?P<open><!-- bench:(?P<name>[\w.@-]+) -->\n)(?P<body>.*?)(?P<close><!-- /bench:(?P=name) -->)",
    re.DOTALL,
)
OPENING = re.compile(r"<!-- bench:([\w.@-]+) -->")


class TableError(Exception):
    """A marker without its closing marker, or naming no bench."""


def documents(root: Path = ROOT) -> list[Path]:
    """Where tables may live: the README and every page of the docs site."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


@cache
def bench_module(name: str) -> ModuleType:
    """bench/NAME.py, imported by path (bench/ is a folder of scripts, not a package)."""
    path = BENCH / f"{name}.py"
    if not path.is_file() or name == "tables":
        raise TableError(f"no bench script {path.name} for the marker 'bench:{name}'")
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # bench scripts import their shared modules (fleet_kit)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    if spec is None or spec.loader is None:
        raise TableError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    if not callable(getattr(module, "render", None)):
        raise TableError(f"bench/{name}.py has no render(result) -> str")
    return module


def result(name: str, results: Path = RESULTS) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((results / f"{name}.json").read_text())
    return loaded


def headline(results: Path = RESULTS) -> str:
    """README's short table: one figure per bench, each against its same-run baseline."""

    def row(rows: list[dict[str, Any]], contender: str) -> dict[str, Any]:
        return next(r for r in rows if r["contender"] == contender)

    producer = result("producer", results)["results"]
    drain = result("consumer", results)["drain"]
    handoff = {(o["scenario"], o["mode"]): o for o in result("handoff", results)["outcomes"]}
    # handoff.py's runs at more shards (handoff-64.json, handoff-64-dynalite.json), if made.
    at_scale = [json.loads(path.read_text()) for path in sorted(results.glob("handoff-*.json"))]
    spark_rows = result("spark_source", results)["results"]

    def spark_ratio(variant: str, contender: str) -> str:
        got = [r for r in spark_rows if r["variant"] == variant and r["contender"] == contender]
        if not got or got[0]["ratio_to_boto3"] is None:
            return "failed" if got else "not run"
        return f"{got[0]['ratio_to_boto3']:.2f}x"

    # spark_source.py --scale (spark_source-scale.json), if made: the default shardsPerTask, local[2].
    scale_path = results / "spark_source-scale.json"
    scale = json.loads(scale_path.read_text()) if scale_path.exists() else None

    def scale_ratio(variant: str) -> str:
        assert scale is not None
        rows = scale["runs"][0]["results"]
        got = [
            r
            for r in rows
            if r["variant"] == variant and r["contender"] == "source, shardsPerTask=auto"
        ]
        if not got or got[0]["ratio_to_boto3"] is None:
            return "failed" if got else "not run"
        return f"{got[0]['ratio_to_boto3']:.2f}x"

    chaos = result("chaos", results)
    fencing = chaos["modes"]["noguard"]
    soak = fencing["report"]
    starvation = result("consumer_starvation", results)
    draining = starvation["draining"]
    put_loop, get_loop = (
        row(producer, "boto3 put_records loop"),
        row(drain, "boto3 GetRecords loop"),
    )
    aggregated, plain = row(producer, "shardflow (aggregated)"), row(producer, "shardflow")
    consumer = row(drain, "shardflow consumer")
    pause = handoff["a", "baseline"]["gap_max"] / max(handoff["a", "handoff"]["gap_max"], 1e-3)
    rows = [
        (
            "producer, KPL-aggregated, vs a boto3 `put_records` loop",
            f"{aggregated['records_per_second'] / put_loop['records_per_second']:.2f}x the records/s",
            "producer",
        ),
        (
            "producer CPU per record, plain records, vs a boto3 `put_records` loop",
            f"{plain['cpu_per_100k'] / put_loop['cpu_per_100k']:.2f}x",
            "producer",
        ),
        (
            "consumer drain vs a boto3 GetRecords loop",
            f"{consumer['records_per_second'] / get_loop['records_per_second']:.2f}x the records/s",
            "consumer",
        ),
        (
            "consumer CPU per record vs a boto3 GetRecords loop",
            f"{consumer['cpu_per_100k'] / get_loop['cpu_per_100k']:.2f}x",
            "consumer",
        ),
        *(
            (
                "consumer CPU per record vs the KCL 2.5.8 (MultiLangDaemon, Python processors)",
                f"{consumer['cpu_per_100k'] / kcl['cpu_per_100k']:.2f}x",
                "consumer",
            )
            for kcl in drain
            if kcl["contender"] == "KCL 2.5.8 MultiLangDaemon" and kcl["verified"]
        ),
        (
            f"lease renewal lateness p99 while {starvation['shards']} shards drain 1 MiB KPL "
            f"aggregates, failover_time {starvation['failover_time']:g} s (target: under 10 %)",
            f"{draining['lateness_p99'] * 1000:.0f} ms "
            f"({draining['lateness_p99'] / starvation['failover_time']:.1%} of failover_time), "
            f"{draining['leases_lost']} leases lost",
            "consumer",
        ),
        (
            "rolling restart, longest pause of a shard: KCL-2.x-style baseline / handoff",
            f"{pause:.1f}x",
            "handoff",
        ),
        *(
            (
                f"rolling restart at {run['shards']} shards (lease table on "
                f"{run['lease_server']}): longest pause of a shard, records handled twice",
                f"{planned['gap_max']:.2f} s, {planned['duplicates']:,} twice "
                f"({planned['lost']:,} lost)",
                "handoff",
            )
            for run in at_scale
            for planned in run["outcomes"]
            if planned["scenario"] == "a" and planned["mode"] == "handoff"
        ),
        (
            "Spark source (readStream, from its first trigger) vs a boto3 GetRecords loop, "
            "plain / KPL-aggregated records, every id checked",
            f"{spark_ratio('plain', 'source, readStream AvailableNow')} / "
            f"{spark_ratio('aggregated', 'source, readStream AvailableNow')} the rows/s",
            "spark_source",
        ),
        *(
            (
                f"Spark source at {scale['shards']} shards (readStream, `shardsPerTask` auto, "
                "local[2]) vs a boto3 GetRecords loop, plain / KPL-aggregated",
                f"{scale_ratio('plain')} / {scale_ratio('aggregated')} the rows/s",
                "spark_source",
            )
            for _ in ([scale] if scale is not None else [])
        ),
        (
            "Spark sink (`df.write`) vs a boto3 PutRecords loop",
            f"{spark_ratio('sink', 'sink, write (batch)')} the rows/s",
            "spark_source",
        ),
        (
            f"chaos soak, {chaos['duration'] / 60:.0f} min of faults at {fencing['rate']:g} "
            "records/s, lease fencing alone: records lost, per-key order violations, two "
            "workers in one shard, stalled shards",
            f"{soak['lost']} / {soak['order_violations']} / {soak['overlaps']} / "
            f"{len(soak['stalled'])} of {soak['written']:,} records "
            f"({soak['duplicates']:,} replayed after a fault, "
            f"{soak['duplicates_by_cause'].get('unexplained', 0)} unexplained; "
            f"{sum(p['interrupted'] for p in soak['per_fault']):,} calls in flight hit)",
            "chaos",
        ),
    ]
    # bench/chaos_spark.py (chaos_spark.json), if made: the Spark pipeline under faults.
    spark_chaos_path = results / "chaos_spark.json"
    if spark_chaos_path.exists():
        sc = json.loads(spark_chaos_path.read_text())
        r = sc["report"]
        recoveries = [p["recovery"] for p in r["per_fault"] if p["recovery"] is not None]
        rows.append(
            (
                f"Spark pipeline under faults on a standalone cluster, {sc['duration'] / 60:.0f} "
                "min (executor and driver kill -9, Kinesis and S3 brownouts, split, merge): "
                "events lost / twice in the file sink, alerts missing, micro-batches past "
                f"{r['batch_bound']:g} s",
                f"{r['lost']} / {r['duplicated']} of {r['events_acked']:,} events, "
                f"{r['alerts_missing']} of {r['alerts_expected']:,} alerts "
                f"({r['alert_duplicates']} extra copies, "
                f"{r['alert_duplicates_by_cause'].get('unexplained', 0)} unexplained), "
                f"{len(r['stuck'])}; slowest recovery {max(recoveries, default=0):.0f} s",
                "chaos_spark",
            )
        )
    lines = ["| what | result | printed by |", "|---|---|---|"]
    lines += [f"| {what} | {value} | `bench/{bench}.py` |" for what, value, bench in rows]
    return "\n".join(lines)


def renderer(name: str, results: Path = RESULTS) -> Callable[[], str]:
    if name == "headline":
        return lambda: headline(results)
    run, _, part = name.partition(".")
    bench, _, variant = run.partition("@")
    function = getattr(bench_module(bench), f"render_{part}" if part else "render", None)
    if not callable(function):
        raise TableError(f"bench/{bench}.py has no render_{part}(result) -> str")
    stored = f"{bench}-{variant}" if variant else bench
    return lambda: str(function(result(stored, results)))


def render_document(text: str, results: Path = RESULTS) -> str:
    """The document with every marked table rendered afresh."""
    opened = OPENING.findall(text)
    closed = [m.group("name") for m in MARKED.finditer(text)]
    if sorted(opened) != sorted(closed):
        unclosed = sorted(set(opened) - set(closed)) or opened
        raise TableError(f"a bench marker without its closing marker: {unclosed}")

    def fill(match: re.Match[str]) -> str:
        table = renderer(match.group("name"), results)().strip("\n")
        return f"{match.group('open')}{table}\n{match.group('close')}"

    return MARKED.sub(fill, text)


def stale(paths: Iterable[Path], results: Path = RESULTS) -> list[Path]:
    """The documents whose tables differ from what the JSON renders to."""
    return [p for p in paths if render_document(p.read_text(), results) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on drift")
    parser.add_argument(
        "--print",
        metavar="DIR",
        type=Path,
        help="print the tables of the results in DIR (e.g. make bench's short runs); touch no file",
    )
    args = parser.parse_args(argv)
    if args.print:
        for path in sorted(args.print.glob("*.json")):
            name = path.stem.replace("-", "@", 1)  # handoff-64.json: a variant of handoff
            print(f"== {path.stem}\n\n{renderer(name, args.print)()}\n")
        return 0
    paths = documents()
    if args.check:
        drifted = stale(paths)
        for path in drifted:
            print(
                f"{path.relative_to(ROOT)}: tables differ from bench/results (run bench/tables.py)"
            )
        return 1 if drifted else 0
    for path in paths:
        text = path.read_text()
        rendered = render_document(text)
        if rendered != text:
            path.write_text(rendered)
            print(f"rewrote the tables of {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
