"""A Spark Connect server started from the pip-installed pyspark (``spark-submit`` of
``SparkConnectServer``, local[2], bound to 127.0.0.1), stopped by its PID."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardflow.local.ports import LOOPBACK, accepts_connections, free_port
from shardflow.local.process import log_tail, spawn, terminate
from support.spark_cluster import spark_home

CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


@contextmanager
def connect_server(log_dir: Path, *, timeout: float = 180.0) -> Iterator[str]:
    """Yields the ``sc://127.0.0.1:PORT`` address of a running server."""
    port = free_port()
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", CONNECT_SERVER,
        "--master", "local[2]",
        "--conf", f"spark.connect.grpc.binding.address={LOOPBACK}",
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.driver.host={LOOPBACK}",
        "spark-internal",
    ]  # fmt: skip
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": LOOPBACK,
        # The server's Python workers run the data source: this interpreter has shardflow.
        "PYSPARK_PYTHON": sys.executable,
    }
    log = log_dir / "spark-connect.log"
    server = spawn(command, env=env, log_path=log, detach=False)
    try:
        deadline = time.monotonic() + timeout
        while not accepts_connections(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Spark Connect server did not start:\n{log_tail(log)}")
            time.sleep(0.2)
        yield f"sc://{LOOPBACK}:{port}"
    finally:
        terminate(server.pid, timeout=15.0)
        server.wait(10)
