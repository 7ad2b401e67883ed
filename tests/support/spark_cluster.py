"""A Spark standalone cluster on 127.0.0.1 from the pip-installed pyspark: one Master and N
Workers started with ``spark-class``, each a child process stopped by its PID.

For the tests and the demo's ``--cluster`` (``python examples/demo --cluster``): executors are
separate JVMs launched by the Workers, with Python workers of their own, so nothing is shared
with the driver but what goes over the network (and the metadata store). Executors run this interpreter
(``spark.pyspark.python``), which has shardflow installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from shardflow.errors import LocalStackError
from shardflow.local.ports import LOOPBACK, free_port
from shardflow.local.process import command_line, log_tail, spawn, terminate
from support.proc_table import processes

_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The pip-installed pyspark's directory (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    """``with StandaloneCluster(log_dir) as cluster: ... cluster.master_url``."""

    log_dir: Path
    workers: int = 2
    cores_per_worker: int = 1
    worker_memory: str = "1g"
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    startup_timeout: float = 180.0
    master_url: str = ""
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _ui_port: int = 0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        port, self._ui_port = free_port(), free_port()
        self.master_url = f"spark://{LOOPBACK}:{port}"
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", LOOPBACK, "--port", str(port), "--webui-port", str(self._ui_port)],
        )
        for index in range(self.workers):
            work_dir = self.log_dir / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            self._spawn(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker",
                [
                    "--host", LOOPBACK,
                    "--cores", str(self.cores_per_worker),
                    "--memory", self.worker_memory,
                    "--webui-port", str(free_port()),
                    "--work-dir", str(work_dir),
                    self.master_url,
                ],
            )  # fmt: skip
        try:
            self._wait_for_workers()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Workers first (each stops its executors), then the Master; by PID, bounded."""
        executors = self.executor_pids()
        for process in reversed(self._processes):
            terminate(process.pid, timeout=10.0)
            process.wait(5)
        for pid in executors:
            terminate(pid, timeout=5.0)
        self._processes.clear()

    def _spawn(self, name: str, main_class: str, args: list[str]) -> None:
        env = {
            **self.env,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": LOOPBACK,
            "PYSPARK_PYTHON": sys.executable,
        }
        command = [str(spark_home() / "bin" / "spark-class"), main_class, *args]
        log = self.log_dir / f"{name}.log"
        self._processes.append(spawn(command, env=env, log_path=log, detach=False))

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise LocalStackError(
                        f"a Spark process exited with {process.returncode}: "
                        + log_tail(self.log_dir / "master.log")
                    )
            if self.alive_workers() >= self.workers:
                return
            time.sleep(0.25)
        raise LocalStackError(
            f"{self.workers} Spark workers did not register in {self.startup_timeout:g}s; "
            f"see {self.log_dir}"
        )

    # --- looking inside --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The Master's JSON status page."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self._ui_port}/json/", timeout=2) as page:
            status: dict[str, Any] = json.load(page)
        return status

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError):
            # Not listening yet, or (seen in CI) the UI answers before its JSON page is ready:
            # an empty body. Either way no worker is counted yet; the caller keeps polling.
            return 0
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def worker_pids(self) -> list[int]:
        return [process.pid for process in self._processes[1:]]

    def executor_pids(self) -> list[int]:
        """The PIDs of the executor JVMs the Workers launched (children of our Workers)."""
        workers = set(self.worker_pids())
        found: list[int] = []
        for proc in processes():
            if proc.parent in workers and _EXECUTOR_CLASS in (command_line(proc.pid) or []):
                found.append(proc.pid)
        return sorted(found)

    def kill_executor(self, pid: int) -> None:
        """SIGKILL one executor JVM (its Worker reports the loss and a new one is launched)."""
        if pid not in self.executor_pids():
            raise LocalStackError(f"{pid} is not an executor of this cluster")
        os.kill(pid, signal.SIGKILL)

    def session_config(self, *, executor_memory: str = "512m") -> dict[str, str]:
        """Spark settings for a driver on this machine using this cluster."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.executor.memory": executor_memory,
            "spark.cores.max": str(self.workers * self.cores_per_worker),
            "spark.pyspark.python": sys.executable,
            "spark.ui.enabled": "false",
        }
