"""The source and the sink from a Spark Connect client (``sc://...``): the data source is
registered on the remote session and runs in the server's Python workers."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.boto import stored_records
from support.connect_server import connect_server
from support.parquet_log import committed_column
from support.spark_source import make_stream, payloads, write

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


EXAMPLE = Path(__file__).parents[3] / "examples" / "spark_connect.py"


@pytest.fixture(scope="module")
def connect_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server for this module's tests."""
    pytest.importorskip("grpc", reason="the pyspark[connect] extra")
    with connect_server(tmp_path_factory.mktemp("spark-connect")) as address:
        yield address


@pytest.fixture(scope="module")
def remote(connect_address: str) -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    import shardflow.spark

    # A remote session switches this process to Spark Connect for good (pyspark sets
    # SPARK_CONNECT_MODE_ENABLED): put it back afterwards, or every later local session fails
    # with CONNECT_URL_NOT_SET.
    connect_mode_before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    session = SparkSession.builder.remote(connect_address).getOrCreate()
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = warnings.append  # type: ignore[method-assign]
    logging.getLogger("shardflow.spark").addHandler(handler)
    with pytest.MonkeyPatch.context() as patch:
        # The client's interpreter says nothing about the server's workers: no warning.
        patch.setenv("PYSPARK_PYTHON", "/nonexistent/python3")
        shardflow.spark.register(session)
    logging.getLogger("shardflow.spark").removeHandler(handler)
    assert not warnings, [w.getMessage() for w in warnings]
    try:
        yield session
    finally:
        session.stop()
        if connect_mode_before is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = connect_mode_before


def test_streaming_source_and_sink_queries_over_spark_connect(
    remote: SparkSession, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    assert type(remote).__module__.startswith("pyspark.sql.connect")
    make_stream(moto_url, stream_name, 2)
    items = payloads("sc", 600)
    write(moto_url, stream_name, items)
    alerts = f"{stream_name}-alerts"
    make_stream(moto_url, alerts, 1)

    def source(meta: str) -> object:
        return (
            remote.readStream.format("shardflow")
            .option("streamName", stream_name)
            .option("endpointUrl", moto_url)
            .option("region", "us-east-1")
            .option("metadataPath", str(tmp_path / meta))
            .option("maxRecordsPerTrigger", "250")
            .load()
        )

    to_parquet = (
        source("meta-parquet")  # type: ignore[attr-defined]
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt-parquet"))
        .trigger(availableNow=True)
        .start()
    )
    to_stream = (
        source("meta-sink")  # type: ignore[attr-defined]
        .selectExpr("data", "partitionKey")
        .writeStream.format("shardflow")
        .option("streamName", alerts)
        .option("endpointUrl", moto_url)
        .option("region", "us-east-1")
        .option("checkpointLocation", str(tmp_path / "ckpt-sink"))
        .trigger(availableNow=True)
        .start()
    )
    to_parquet.awaitTermination(240)
    to_stream.awaitTermination(240)
    assert to_parquet.exception() is None
    assert to_stream.exception() is None

    expected = {data for _, data in items}
    rows = Counter(committed_column(tmp_path / "out", "data"))
    assert set(rows) == expected
    assert max(rows.values()) == 1
    assert {bytes(r["Data"]) for _, r in stored_records(moto_url, alerts)} == expected


def test_the_spark_connect_example_copies_a_stream(
    connect_address: str, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """examples/spark_connect.py, the README's Connect way in, run as a user runs it."""
    make_stream(moto_url, stream_name, 2)
    items = payloads("example", 40)
    write(moto_url, stream_name, items)
    alerts = f"{stream_name}-copy"
    make_stream(moto_url, alerts, 1)
    command = [
        sys.executable, str(EXAMPLE), connect_address, stream_name, alerts,
        "--state", str(tmp_path / "state"), "--endpoint-url", moto_url, "--timeout", "240",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"copied {len(items)} records" in done.stdout
    assert {bytes(r["Data"]) for _, r in stored_records(moto_url, alerts)} == {
        data for _, data in items
    }
