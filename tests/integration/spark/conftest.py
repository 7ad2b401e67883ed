"""One SparkSession (local[2]) for every Spark test: a cold start costs 7-10 s; one
standalone cluster for the tests that need one."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from support.spark_cluster import StandaloneCluster


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] session with the ``shardflow`` format registered.

    Python workers run this interpreter (the venv's), whatever ``python3`` is on PATH; they
    inherit the session-wide dummy AWS settings from tests/conftest.py.
    """
    from pyspark.sql import SparkSession

    import shardflow.spark

    patch = pytest.MonkeyPatch()
    # SparkContext picks its workers' interpreter from PYSPARK_PYTHON (default: python3 on PATH).
    patch.setenv("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("shardflow-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    shardflow.spark.register(session)
    yield session
    session.stop()
    patch.undo()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone cluster (Master + 2 Workers of 1 core) on 127.0.0.1, one per session."""
    from support.spark_cluster import StandaloneCluster

    with StandaloneCluster(
        tmp_path_factory.mktemp("spark-cluster"), env=dict(os.environ)
    ) as cluster:
        yield cluster
