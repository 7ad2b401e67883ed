"""``shardflow multilang`` as a user runs it, for tests and benches: a properties file, the
command in a process of its own (started and stopped by PID), kclpy processors from the
scratch venv of :mod:`support.kcl.install`.

::

    python = kclpy_python()                        # or pytest.skip(reason)
    run = MultiLangRun(work_dir, "w1", {"executableName": f"{python} {BEHAVING} --out ...", ...})
    run.start(); ...; run.stop()                    # SIGTERM: graceful
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from shardflow.local.process import is_alive, log_tail
from support.kcl import KCL_2, KclUnavailable, ensure_installed

KCL_SUPPORT = Path(__file__).with_name("kcl")
BEHAVING = KCL_SUPPORT / "behaving.py"
RECORDING = KCL_SUPPORT / "processor.py"
NODE_PROCESSOR = Path(__file__).with_name("multilang_processor.js")
REPO = Path(__file__).resolve().parents[2]


def kclpy_python() -> Path:
    """The Python of a venv with amazon_kclpy (the jar-bundling wheel's; no JVM used)."""
    return ensure_installed(KCL_2).python


def kclpy_or_skip() -> Path:
    import pytest

    try:
        return kclpy_python()
    except KclUnavailable as missing:
        pytest.skip(f"not run: {missing.reason}")


def properties(
    *,
    processor: str,
    stream: str,
    application: str,
    kinesis: str,
    dynamodb: str,
    worker: str,
    **extra: str,
) -> dict[str, str]:
    """A properties file's keys as a KCL user writes them (polling, quick failover)."""
    keys = {
        "executableName": processor,
        "streamName": stream,
        "applicationName": application,
        "workerId": worker,
        "AwsCredentialsProvider": "DefaultCredentialsProvider",
        "processingLanguage": "python/3",
        "initialPositionInStream": "TRIM_HORIZON",
        "regionName": "us-east-1",
        "kinesisEndpoint": kinesis,
        "dynamoDBEndpoint": dynamodb,
        "retrievalMode": "POLLING",
        "idleTimeBetweenReadsInMillis": "200",
        "failoverTimeMillis": "3000",
        "metricsLevel": "NONE",
        "shutdownGraceMillis": "10000",
    }
    keys.update(extra)
    return keys


class MultiLangRun:
    """One ``shardflow multilang`` worker process; its log is ``<work_dir>/<name>.log``."""

    def __init__(
        self,
        work_dir: Path,
        name: str,
        keys: Mapping[str, str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.work_dir = work_dir
        self.name = name
        self.properties_path = work_dir / f"{name}.properties"
        self.log_path = work_dir / f"{name}.log"
        self.keys = dict(keys)
        self.env = env
        self.cwd = cwd
        self.args = args
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.keys:
            self.properties_path.write_text(
                "".join(f"{key} = {value}\n" for key, value in self.keys.items())
            )
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("AWS_ACCESS_KEY_ID", "testing")
        env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        command = [
            sys.executable,
            "-m",
            "shardflow",
            "multilang",
            "--properties-file",
            str(self.properties_path),
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (graceful: processors checkpoint, leases handed over); SIGKILL after timeout."""
        return self._end(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        return self._end(signal.SIGKILL, 10.0)

    def _end(self, signum: signal.Signals, timeout: float) -> int | None:
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        return process.returncode

    def wait(self, timeout: float) -> int | None:
        assert self._process is not None
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines=lines)


def wait_until(
    condition: object, timeout: float, what: str, run: MultiLangRun | None = None
) -> None:
    """Poll ``condition()`` every 0.1 s until true; fail with ``what`` (and the log) after
    ``timeout`` seconds or when ``run`` exited."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if run is not None and not run.running:
            raise AssertionError(f"{what}: shardflow multilang exited\n{run.log_tail()}")
        if time.monotonic() > deadline:
            tail = run.log_tail() if run is not None else ""
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tail}")
        time.sleep(0.1)


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the record processors of a daemon)."""
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children() if is_alive(child.pid)]
    except psutil.Error:
        return []


def start_worker(
    work_dir: Path,
    name: str,
    *,
    processor: str,
    stream: str,
    kinesis: str,
    dynamodb: str,
    **extra: str,
) -> MultiLangRun:
    """A started ``shardflow multilang`` worker named ``name`` (its workerId too) of the
    application ``app-<stream>``, with :func:`properties` and ``extra`` keys."""
    run = MultiLangRun(
        work_dir,
        name,
        properties(
            processor=processor,
            stream=stream,
            application=f"app-{stream}",
            kinesis=kinesis,
            dynamodb=dynamodb,
            worker=name,
            **extra,
        ),
    )
    run.start()
    return run
