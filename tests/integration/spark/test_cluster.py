"""The source and the sink on a real standalone cluster (Master + 2 Workers, executors in
their own JVMs), metadata on S3 (moto): exactly once into Parquet while an executor JVM is
SIGKILLed mid-batch and the driver is SIGKILLed and started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.boto import boto_client, stored_records
from support.parquet_log import committed_column
from support.spark_source import make_stream, payloads, write

if TYPE_CHECKING:
    from support.spark_cluster import StandaloneCluster

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

DRIVER = Path(__file__).parents[2] / "support" / "cluster_driver.py"


def logged(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / kind
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def in_flight(checkpoint: Path) -> set[int]:
    return logged(checkpoint, "offsets") - logged(checkpoint, "commits")


def start_driver(config: dict[str, object], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the driver and its JVM die together
        )


def kill_driver(driver: subprocess.Popen[bytes]) -> None:
    os.killpg(driver.pid, signal.SIGKILL)  # the group this test started for the driver
    driver.wait(30)


def wait_for(condition: object, what: str, timeout: float, driver: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert driver.poll() is None, f"the driver exited ({driver.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_exactly_once_on_a_cluster_through_executor_and_driver_kills(
    spark_cluster: StandaloneCluster, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    make_stream(moto_url, stream_name, 2)
    items = payloads("c", 2400)
    write(moto_url, stream_name, items)
    sink_stream = f"{stream_name}-out"
    make_stream(moto_url, sink_stream, 2)
    bucket = f"sf-meta-{uuid.uuid4().hex[:12]}"
    boto_client("s3", moto_url).create_bucket(Bucket=bucket)
    checkpoint, out = tmp_path / "ckpt", tmp_path / "out"
    config: dict[str, object] = {
        "spark": spark_cluster.session_config(),
        "endpoint": moto_url,
        "stream": stream_name,
        "metadata": f"s3://{bucket}/queries/orders",
        "perTrigger": 200,
        "out": str(out),
        "checkpoint": str(checkpoint),
    }
    log = tmp_path / "driver.log"

    driver = start_driver(config, log)
    try:
        # An executor JVM dies while a batch is being read and written.
        wait_for(
            lambda: logged(checkpoint, "commits") and in_flight(checkpoint),
            "a batch in flight",
            240,  # the driver's JVM, its executors and their Python workers start first
            driver,
        )
        victims = spark_cluster.executor_pids()
        assert victims, "no executor JVM found"
        spark_cluster.kill_executor(victims[0])
        # The driver dies with a later batch in flight.
        passed = max(logged(checkpoint, "commits"))
        wait_for(
            lambda: in_flight(checkpoint) and min(in_flight(checkpoint)) > passed + 1,
            "a later batch in flight",
            240,
            driver,
        )
        kill_driver(driver)
    finally:
        if driver.poll() is None:
            kill_driver(driver)
    killed_at = len(logged(checkpoint, "commits"))
    assert killed_at < 12, "the query finished before the driver was killed"

    driver = start_driver({**config, "sinkStream": sink_stream}, log)
    try:
        assert driver.wait(240) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            kill_driver(driver)

    rows = Counter(committed_column(out, "data"))
    expected = {data for _, data in items}
    assert not {d: n for d, n in rows.items() if n > 1}, "records written twice"
    assert set(rows) == expected, f"{len(expected - set(rows))} records missing"
    # The sink on the cluster wrote every committed row to the second stream (at least once).
    sunk = {bytes(record["Data"]) for _, record in stored_records(moto_url, sink_stream)}
    assert sunk == expected
