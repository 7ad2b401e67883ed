"""What Spark left on disk for ``bench/chaos_spark.py`` to check: the micro-batches of each
query from its checkpoint folder, and the task attempts from the drivers' event logs.

Spark writes ``offsets/N`` when it plans batch N and ``commits/N`` when the batch is done; the
files' modification times are when. The shardflow source's offset (the third line of an offsets
file) names the shards the batch reads. An event log is JSON lines, one file per driver run;
a driver killed with -9 leaves its last lines unwritten (buffered), so tasks lost with it are
a lower bound.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import chaos_spark_check as check


def read_batches(work: Path, queries: tuple[str, ...]) -> list[check.Batch]:
    """Every micro-batch from the queries' checkpoint folders: planned when its offsets file
    was written, committed when its commits file was (None: not yet), the shards it reads."""
    found = []
    for query in queries:
        folder = work / f"checkpoint-{query}"
        commits = {
            int(p.name): p.stat().st_mtime
            for p in (folder / "commits").glob("[0-9]*")
            if p.name.isdigit()
        }
        for path in (folder / "offsets").glob("[0-9]*"):
            if not path.name.isdigit():
                continue
            try:
                lines = path.read_text().splitlines()
                started = path.stat().st_mtime
            except OSError:
                continue
            reads: tuple[str, ...] = ()
            if len(lines) >= 3:
                # An offsets file being written: its shards are read next time.
                with contextlib.suppress(ValueError):
                    reads = tuple(sorted(json.loads(lines[2]).get("read", {})))
            batch_id = int(path.name)
            found.append(check.Batch(query, batch_id, started, commits.get(batch_id), reads))
    return sorted(found, key=lambda b: (b.started, b.query))


def read_tasks(event_logs: Path, drivers: list[check.DriverRun]) -> list[check.Task]:
    """Task attempts from the drivers' event logs (one file per driver run, matched to the
    runs by start time); a task started and never ended belongs to a driver that died."""
    apps: list[tuple[float, list[check.Task]]] = []
    for path in sorted(event_logs.glob("*")):
        started_at = 0.0
        starts: dict[tuple[int, int], float] = {}
        ends: dict[tuple[int, int], tuple[float, str]] = {}
        # A folder (Spark's rolling "eventlog_v2_*" layout) holds its parts as events_N_*.
        parts = sorted(path.glob("events_*"), key=_part) if path.is_dir() else [path]
        text = "".join(p.read_text(errors="replace") for p in parts if p.suffix != ".zstd")
        for line in text.split("\n")[:-1]:  # a torn last line of a killed driver: dropped
            try:
                event = json.loads(line)
            except ValueError:
                continue
            name = event.get("Event")
            if name == "SparkListenerApplicationStart":
                started_at = event["Timestamp"] / 1000
            elif name in ("SparkListenerTaskStart", "SparkListenerTaskEnd"):
                info = event["Task Info"]
                key = (info["Task ID"], info["Attempt"])
                if name == "SparkListenerTaskStart":
                    starts[key] = info["Launch Time"] / 1000
                else:
                    starts.setdefault(key, info["Launch Time"] / 1000)
                    reason = event.get("Task End Reason", {}).get("Reason", "?")
                    ends[key] = (info["Finish Time"] / 1000, reason)
        tasks = [
            check.Task(
                -1, start, ends[key][0] if key in ends else None, ends.get(key, (0, None))[1]
            )
            for key, start in starts.items()
        ]
        apps.append((started_at, tasks))
    apps.sort(key=lambda a: a[0])
    runs = sorted(range(len(drivers)), key=lambda i: drivers[i].started)
    out = []
    for index, (_, tasks) in enumerate(apps):
        driver = runs[index] if index < len(runs) else -1
        out += [check.Task(driver, t.started, t.finished, t.reason) for t in tasks]
    return out


def _part(path: Path) -> int:
    number = path.name.split("_")[1]
    return int(number) if number.isdigit() else 0


def in_flight(work: Path, queries: tuple[str, ...]) -> bool:
    return any(b.committed is None for b in read_batches(work, queries))
