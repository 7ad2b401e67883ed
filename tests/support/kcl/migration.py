"""The mixed-fleet migration scenario: real KCL workers and a shardflow worker on one lease table.

Records flow at ``rate`` per shard per second the whole time. Two KCL workers (K1, K2) process
the stream; then, each step timed and checked on its own:

1. ``shardflow joins``: shardflow worker S1 starts; the KCL 3.x leader hands it leases (KCL
   2.x workers: it takes its share as a 2.x worker would);
2. ``KCL stops``: K1 gets SIGTERM (graceful shutdown: its processors checkpoint);
3. ``shardflow stops``: S1 gets SIGTERM; its leases go to K2.

Then the producer stops and K2 drains the rest. Per step: records handled a second time (a
second handling counts in the step during which it happened), each shard's longest time
without a handled record, who held what when the step ended. Overall: records never handled.
Every KCL and shardflow process logs each handled record (``support.kcl.handled``); files
stay in ``work_dir``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3

from support.kcl.daemon import KclWorker, KclWorkerConfig
from support.kcl.handled import Handled, duplicated, longest_gaps, read_handled
from support.kcl.install import KclInstall
from support.kcl.tables import seed_lease_table

REGION = "us-east-1"
_TESTS = Path(__file__).resolve().parents[2]


@dataclass
class StepResult:
    name: str
    seconds: float
    duplicates: int
    longest_gap: float
    gaps: dict[str, float]
    owners_after: dict[str, int]
    done: bool
    """The step reached its end state (every shard flowing again, the leases where expected)."""
    note: str = ""


@dataclass
class MigrationResult:
    kcl: str
    shards: int
    rate_per_shard: int
    failover_seconds: float
    steps: list[StepResult] = field(default_factory=list)
    written: int = 0
    lost: int = 0
    duplicates: int = 0
    fleet_modes: list[str] = field(default_factory=list)
    work_dir: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Producer(threading.Thread):
    """``rate`` records/s to every shard (explicit hash keys) until stopped; ids remembered."""

    def __init__(self, kinesis: Any, stream: str, hash_keys: Mapping[str, str], rate: int) -> None:
        super().__init__(daemon=True)
        self._kinesis = kinesis
        self._stream = stream
        self._keys = dict(hash_keys)
        self._rate = rate
        self.written: set[str] = set()
        self._halt = threading.Event()
        self._next = 0

    def run(self) -> None:
        tick = 0.2
        per_tick = max(1, round(self._rate * tick))
        next_at = time.monotonic()
        while not self._halt.is_set():
            entries = []
            for key in self._keys.values():
                for _ in range(per_tick):
                    entries.append((f"{self._next:09d}", key))
                    self._next += 1
            self._put(entries)
            next_at += tick
            self._halt.wait(max(0.0, next_at - time.monotonic()))

    def _put(self, entries: list[tuple[str, str]]) -> None:
        pending = entries
        for _ in range(20):
            answer = self._kinesis.put_records(
                StreamName=self._stream,
                Records=[
                    {"Data": f"{rid}|x".encode(), "PartitionKey": rid, "ExplicitHashKey": key}
                    for rid, key in pending
                ],
            )
            retry = []
            for entry, result in zip(pending, answer["Records"], strict=True):
                if "SequenceNumber" in result:
                    self.written.add(entry[0])
                else:
                    retry.append(entry)
            if not retry:
                return
            pending = retry
            time.sleep(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class MigrationScenario:
    """One run of the scenario (see the module doc). ``kcl_kinesis_url`` is an HTTP/2-cleartext
    endpoint for the KCL (kinesis-local, or kinesalite behind ``H2cProxy``);
    ``kinesis_url`` the plain one for boto3 and shardflow."""

    def __init__(
        self,
        install: KclInstall,
        *,
        kinesis_url: str,
        kcl_kinesis_url: str,
        dynamodb_url: str,
        work_dir: Path,
        shards: int = 8,
        rate: int = 50,
        failover_ms: int = 10_000,
        kcl_properties: Mapping[str, str] | None = None,
        step_timeout: float = 180.0,
        settle: float = 5.0,
        log: Callable[[str], None] = print,
    ) -> None:
        self.install = install
        self.kinesis_url = kinesis_url
        self.kcl_kinesis_url = kcl_kinesis_url
        self.dynamodb_url = dynamodb_url
        self.work_dir = work_dir
        self.shards = shards
        self.rate = rate
        self.failover_ms = failover_ms
        self.kcl_properties = dict(kcl_properties or {})
        self.step_timeout = step_timeout
        self.settle = settle
        self.log = log
        stamp = f"{int(time.time() * 1000) % 10**9}"
        self.stream = f"kcl-fleet-{install.release.major}-{stamp}"
        self.application = f"kcl-fleet-app-{install.release.major}-{stamp}"
        self.handled_path = work_dir / "handled.tsv"
        self._kinesis: Any = boto3.client("kinesis", endpoint_url=kinesis_url, region_name=REGION)
        self._dynamodb: Any = boto3.client(
            "dynamodb", endpoint_url=dynamodb_url, region_name=REGION
        )
        self._kcl: dict[str, KclWorker] = {}
        self._shardflow: dict[str, subprocess.Popen[bytes]] = {}

    # --- the run ----------------------------------------------------------------------------

    def run(self) -> MigrationResult:
        began = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        result = MigrationResult(
            kcl=self.install.release.label,
            shards=self.shards,
            rate_per_shard=self.rate,
            failover_seconds=self.failover_ms / 1000,
            work_dir=str(self.work_dir),
        )
        producer = self._start_stream()
        try:
            self._start_kcl("K1")
            self._start_kcl("K2")
            warm = self._wait(
                lambda: self._flowing(time.time() - 3) and {"K1", "K2"} <= set(self._owners()),
                self.step_timeout,
            )
            self.log(f"  warm-up {'done' if warm else 'timed out'}: owners {self._owners()}")
            result.steps.append(self._step("shardflow joins", self._join))
            result.steps.append(self._step("KCL stops", self._kcl_stops))
            result.steps.append(self._step("shardflow stops", self._shardflow_stops))
        finally:
            producer.stop()
            try:
                self._wait(lambda: producer.written <= self._keys_handled(), 60)
            finally:
                self._stop_everything()
        handled = self._handled()
        result.written = len(producer.written)
        result.lost = len(producer.written - {h.key for h in handled})
        result.duplicates = len(duplicated(handled))
        result.fleet_modes = self._fleet_modes()
        result.seconds = round(time.monotonic() - began, 1)
        return result

    def _step(self, name: str, act: Callable[[], tuple[bool, str]]) -> StepResult:
        self.log(f"  step: {name}")
        start = time.time()
        done, note = act()
        time.sleep(self.settle)
        end = time.time()
        handled = self._handled()
        again = [h for h in duplicated(handled) if start <= h.at <= end]
        gaps = longest_gaps(handled, start, end)
        step = StepResult(
            name=name,
            seconds=round(end - start, 1),
            duplicates=len(again),
            longest_gap=round(max(gaps.values(), default=0.0), 2),
            gaps={shard: round(gap, 2) for shard, gap in sorted(gaps.items())},
            owners_after=self._owners(),
            done=done,
            note=note,
        )
        self.log(
            f"    {step.seconds:.0f} s, twice {step.duplicates}, longest gap "
            f"{step.longest_gap:.1f} s, owners {step.owners_after}{', ' + note if note else ''}"
        )
        return step

    def _join(self) -> tuple[bool, str]:
        self._start_shardflow("S1")
        done = self._wait(
            lambda: (
                self._owners().get("S1", 0) > 0
                and not self._handoffs_pending()
                and self._flowing(time.time() - 3)
            ),
            self.step_timeout,
        )
        return done, "" if done else "S1 got no lease"

    def _kcl_stops(self) -> tuple[bool, str]:
        stopped_at = time.time()
        self._kcl["K1"].stop()
        done = self._wait(
            lambda: "K1" not in self._owners() and self._flowing(max(stopped_at, time.time() - 3)),
            self.step_timeout,
        )
        return done, "" if done else "K1's shards did not resume"

    def _shardflow_stops(self) -> tuple[bool, str]:
        process = self._shardflow["S1"]
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            return False, "S1 did not stop within 60 s"
        exited = time.time()
        done = self._wait(
            lambda: "S1" not in self._owners() and self._flowing(max(exited, time.time() - 3)),
            self.step_timeout,
        )
        return done, "" if done else "S1's shards did not resume"

    # --- parts --------------------------------------------------------------------------------

    def _start_stream(self) -> _Producer:
        self._kinesis.create_stream(StreamName=self.stream, ShardCount=self.shards)
        self._kinesis.get_waiter("stream_exists").wait(
            StreamName=self.stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
        seed_lease_table(self.dynamodb_url, self.kinesis_url, self.application, self.stream)
        shards = self._kinesis.list_shards(StreamName=self.stream)["Shards"]
        keys = {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}
        producer = _Producer(self._kinesis, self.stream, keys, self.rate)
        producer.start()
        return producer

    def _start_kcl(self, name: str) -> None:
        config = KclWorkerConfig(
            self.application,
            self.stream,
            name,
            self.kcl_kinesis_url,
            self.dynamodb_url,
            failover_ms=self.failover_ms,
            checkpoint_every=100,
            checkpoint_seconds=2.0,
            extra=self.kcl_properties,
        )
        worker = KclWorker(self.install, config, self.work_dir, handled_path=self.handled_path)
        worker.start()
        self._kcl[name] = worker

    def _start_shardflow(self, name: str) -> None:
        env = dict(os.environ)
        env.update(
            {
                "AWS_ENDPOINT_URL_KINESIS": self.kinesis_url,
                "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb_url,
                "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": self.dynamodb_url,
                "AWS_DEFAULT_REGION": REGION,
                "AWS_ACCESS_KEY_ID": env.get("AWS_ACCESS_KEY_ID", "testing"),
                "AWS_SECRET_ACCESS_KEY": env.get("AWS_SECRET_ACCESS_KEY", "testing"),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(_TESTS), env.get("PYTHONPATH")])),
            }
        )
        command = [
            sys.executable,
            "-m",
            "support.kcl.shardflow_worker",
            "--stream",
            self.stream,
            "--application",
            self.application,
            "--worker-id",
            name,
            "--out",
            str(self.handled_path),
            "--failover",
            str(self.failover_ms / 1000),
        ]
        with (self.work_dir / f"{name}.log").open("ab") as log:
            self._shardflow[name] = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def _stop_everything(self) -> None:
        for process in self._shardflow.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        for worker in self._kcl.values():
            worker.stop(timeout=30)

    # --- observation --------------------------------------------------------------------------

    def _items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._dynamodb.scan(
            TableName=self.application, ConsistentRead=True
        )["Items"]
        return items

    def _owners(self) -> dict[str, int]:
        owners = Counter(
            item.get("leaseOwner", {}).get("S", "(free)")
            for item in self._items()
            if item.get("checkpoint", {}).get("S") != "SHARD_END"
        )
        return dict(sorted(owners.items()))

    def _handoffs_pending(self) -> bool:
        return any("checkpointOwner" in item for item in self._items())

    def _handled(self) -> list[Handled]:
        return read_handled([self.handled_path])

    def _keys_handled(self) -> set[str]:
        return {h.key for h in self._handled()}

    def _flowing(self, since: float) -> bool:
        """Every shard has a record handled after ``since``."""
        recent = {h.shard for h in self._handled() if h.at > since}
        return len(recent) >= self.shards

    def _fleet_modes(self) -> list[str]:
        modes = []
        for name in self._shardflow:
            path = self.work_dir / f"{name}.log"
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    if "fleet mode" in line:
                        modes.append(f"{name}: {line.split(' ', 1)[1]}")
        return modes

    @staticmethod
    def _wait(condition: Callable[[], bool], within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.5)
        return False
