"""One real KCL worker: a MultiLangDaemon JVM with Python record processors, started by PID.

    install = ensure_installed(KCL_3)                # or KclUnavailable(reason)
    worker = KclWorker(install, KclWorkerConfig(...), work_dir)
    worker.start()
    ...
    worker.stop()        # SIGTERM: the KCL's graceful shutdown (processors checkpoint)
    worker.kill()        # SIGKILL: a crash

The JVM's Kinesis client speaks HTTP/2 cleartext only: give it kinesis-local's URL, or
kinesalite's through :class:`support.kcl.proxy.H2cProxy`. CBOR is always off (kinesalite does
not speak it, kinesis-local does not need it). The instance-metadata probes of the SDK and of
KCL 3.x's worker metrics are sent to a closed port on 127.0.0.1 (see ``_jvm_flags``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from shardflow.local.ports import free_port
from shardflow.local.process import is_alive, log_tail
from support.kcl.install import KclInstall

_PROCESSOR = Path(__file__).with_name("processor.py")
MAIN_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"

_LOGBACK = """<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{30} - %msg%n</pattern></encoder>
  </appender>
  <root level="{level}"><appender-ref ref="OUT"/></root>
</configuration>
"""


@dataclass(frozen=True)
class KclWorkerConfig:
    """What one worker runs against. Timings default to the KCL's own defaults."""

    application: str
    stream: str
    worker_id: str
    kinesis_endpoint: str
    dynamodb_endpoint: str
    region: str = "us-east-1"
    failover_ms: int = 10_000
    idle_time_ms: int | None = None
    initial_position: str = "TRIM_HORIZON"
    checkpoint_every: int = 500
    checkpoint_seconds: float = 5.0
    log_level: str = "INFO"
    #: How long SIGTERM lets the processors checkpoint. The MultiLangDaemon's default is 0:
    #: no graceful shutdown at all; deployments that roll workers set it.
    shutdown_grace_ms: int = 30_000
    #: Any other MultiLangDaemon property (e.g. ``leaseAssignmentIntervalMillis``).
    extra: Mapping[str, str] = field(default_factory=dict)


class KclWorker:
    """A MultiLangDaemon child process; its processors append to ``handled_path``."""

    def __init__(
        self,
        install: KclInstall,
        config: KclWorkerConfig,
        work_dir: Path,
        *,
        handled_path: Path | None = None,
    ) -> None:
        self.install = install
        self.config = config
        self.work_dir = work_dir
        self.handled_path = handled_path or work_dir / f"{config.worker_id}.handled"
        self.log_path = work_dir / f"{config.worker_id}.log"
        self.properties_path = work_dir / f"{config.worker_id}.properties"
        self._process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError(f"KCL worker {self.config.worker_id} already started")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(self.properties_text())
        logback = self.work_dir / f"{self.config.worker_id}.logback.xml"
        logback.write_text(_LOGBACK.replace("{level}", self.config.log_level))
        command = [
            self.install.java,
            *self._jvm_flags(logback),
            "-cp",
            self.install.classpath,
            MAIN_CLASS,
            "--properties-file",
            str(self.properties_path),
        ]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", str(self.work_dir)),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": self.config.region,
            "AWS_DEFAULT_REGION": self.config.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                cwd=self.work_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started_at = time.time()

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (graceful shutdown: processors are asked to checkpoint); SIGKILL after timeout."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the JVM (a crash); its processors exit when their stdin closes."""
        self._end(signal.SIGKILL, 10.0)

    def _end(self, signum: signal.Signals, timeout: float) -> None:
        process = self._process
        if process is None:
            return
        children = self._children()
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        # Processors normally exit with the JVM; never leave one behind (ours, by PID).
        deadline = time.monotonic() + 5.0
        for child in children:
            while is_alive(child.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if is_alive(child.pid):
                child.kill()
        self._process = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"KCL worker {self.config.worker_id} is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines=lines)

    # --- measurements -------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """User + system CPU of the JVM and its live processors so far."""
        total = 0.0
        for process in self._tree():
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def rss_bytes(self) -> int:
        """Resident memory of the JVM plus its processors now."""
        total = 0
        for process in self._tree():
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        return total

    def _tree(self) -> list[psutil.Process]:
        if not self.running:
            return []
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def _children(self) -> list[psutil.Process]:
        return self._tree()[1:]

    # --- configuration ------------------------------------------------------------------------

    def properties_text(self) -> str:
        c = self.config
        processor = " ".join(
            [
                str(self.install.python),
                str(_PROCESSOR),
                "--out",
                str(self.handled_path),
                "--worker",
                c.worker_id,
                "--checkpoint-every",
                str(c.checkpoint_every),
                "--checkpoint-seconds",
                str(c.checkpoint_seconds),
            ]
        )
        # The credentials chain reads the worker's environment (dummy keys); 3.x takes the
        # SDK v2 class name under a renamed key.
        credentials = (
            ("AwsCredentialsProvider", "DefaultCredentialsProvider")
            if self.install.release.major >= 3
            else ("AWSCredentialsProvider", "DefaultAWSCredentialsProviderChain")
        )
        properties: dict[str, str] = {
            "executableName": processor,
            "streamName": c.stream,
            "applicationName": c.application,
            "workerId": c.worker_id,
            credentials[0]: credentials[1],
            "processingLanguage": "python/3",
            "initialPositionInStream": c.initial_position,
            "regionName": c.region,
            "kinesisEndpoint": c.kinesis_endpoint,
            "dynamoDBEndpoint": c.dynamodb_endpoint,
            "retrievalMode": "POLLING",
            "metricsLevel": "NONE",
            "failoverTimeMillis": str(c.failover_ms),
            "shutdownGraceMillis": str(c.shutdown_grace_ms),
        }
        if c.idle_time_ms is not None:
            properties["idleTimeBetweenReadsInMillis"] = str(c.idle_time_ms)
        properties.update(c.extra)
        return "".join(f"{key} = {value}\n" for key, value in properties.items())

    def _jvm_flags(self, logback: Path) -> list[str]:
        # Plain-HTTP requests to anything but loopback (the SDK's and KCL 3.x's EC2 metadata
        # probes to 169.254.169.254) go to a proxy port nobody listens on: refused at once,
        # never leaving the machine. Requests to the emulators on 127.0.0.1 go direct.
        dead_port = free_port()
        return [
            "-Daws.cborEnabled=false",
            "-Daws.disableEc2Metadata=true",
            "-Dhttp.proxyHost=127.0.0.1",
            f"-Dhttp.proxyPort={dead_port}",
            "-Dhttp.nonProxyHosts=127.0.0.1|localhost",
            f"-Dlogback.configurationFile={logback}",
        ]
