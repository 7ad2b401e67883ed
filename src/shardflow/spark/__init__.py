"""PySpark Structured Streaming source and sink for Kinesis, format ``shardflow``.

    import shardflow.spark
    shardflow.spark.register(spark)
    df = spark.readStream.format("shardflow").option("streamName", "orders").load()

Requires the ``spark`` extra (``pip install 'shardflow[spark]'``): pyspark 4.3 and pyarrow.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "shardflow"

log = logging.getLogger(__name__)


def register(spark: SparkSession) -> None:
    """Register the ``shardflow`` data source with ``spark`` (idempotent per session).

    Also makes ``spark.readStream.format("shardflow")...load()`` check the options a streaming
    read needs (``metadataPath``) right there, not when the query starts
    (:mod:`shardflow.spark.stream_load`).

    Warns (logger ``shardflow.spark``) when the interpreter Spark starts for its Python
    workers on this machine cannot import shardflow, and says how to fix it (not for a Spark
    Connect session: its workers run on the server).
    """
    from shardflow.spark.datasource import ShardflowDataSource
    from shardflow.spark.stream_load import check_stream_loads

    spark.dataSource.register(ShardflowDataSource)
    check_stream_loads(type(spark.readStream))
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return  # Spark Connect: the workers are the server's, which this machine cannot see
    problem = worker_python_problem(spark.conf.get("spark.pyspark.python", None))
    if problem is not None:
        log.warning("%s", problem)


def worker_python_problem(
    configured: str | None, environ: dict[str, str] | None = None
) -> str | None:
    """Why Spark's Python workers would not find shardflow, with the fix; None if they would.

    Spark runs ``spark.pyspark.python``, else ``$PYSPARK_PYTHON``, else ``python3`` from PATH.
    """
    env = os.environ if environ is None else environ
    chosen = (
        configured or env.get("PYSPARK_PYTHON") or shutil.which("python3", path=env.get("PATH"))
    )
    source = (
        "spark.pyspark.python"
        if configured
        else "PYSPARK_PYTHON"
        if env.get("PYSPARK_PYTHON")
        else "python3 on PATH"
    )
    fix = (
        f"set PYSPARK_PYTHON={sys.executable} (the interpreter running this program) before "
        "the SparkSession starts, or install shardflow[spark] for that interpreter"
    )
    if chosen is None:
        return f"Spark's Python workers need python3 on PATH or PYSPARK_PYTHON: {fix}"
    resolved = shutil.which(chosen, path=env.get("PATH")) or chosen
    if Path(resolved).resolve() == Path(sys.executable).resolve():
        return None
    try:
        found = subprocess.run(
            [resolved, "-c", "import shardflow"], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return (
            f"Spark's Python workers would run {resolved} ({source}), which fails: {error}; {fix}"
        )
    if found.returncode == 0:
        return None
    return (
        f"Spark's Python workers would run {resolved} ({source}), which cannot import "
        f"shardflow: every query would fail with ModuleNotFoundError; {fix}"
    )


__all__ = ["FORMAT", "register"]
