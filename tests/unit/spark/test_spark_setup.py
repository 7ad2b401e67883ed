"""Spark set-up mistakes reported where they are made (issue 14, 2), without a Spark session."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from shardflow.errors import SparkOptionError
from shardflow.spark import worker_python_problem
from shardflow.spark.source.options import check_options


def _fake_python(directory: Path) -> Path:
    """A ``python3`` that cannot import anything shardflow's (like a system interpreter)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "python3"
    script.write_text("#!/bin/sh\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_workers_running_this_interpreter_are_fine() -> None:
    assert worker_python_problem(None, {"PYSPARK_PYTHON": sys.executable}) is None
    assert worker_python_problem(sys.executable, {}) is None


def test_python3_on_path_without_shardflow_gets_the_exact_fix(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path / "bin")
    problem = worker_python_problem(None, {"PATH": str(fake.parent)})
    assert problem is not None
    assert f"would run {fake}" in problem
    assert "python3 on PATH" in problem
    assert f"PYSPARK_PYTHON={sys.executable}" in problem


def test_a_configured_interpreter_is_checked_too(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path / "bin")
    problem = worker_python_problem(None, {"PYSPARK_PYTHON": str(fake), "PATH": os.defpath})
    assert problem is not None
    assert "(PYSPARK_PYTHON)" in problem


def test_options_wrong_for_any_read_are_refused_when_defined() -> None:
    check_options({"streamName": "orders"})  # metadataPath: only streaming needs it, later
    check_options({"streamName": "orders", "endingPosition": "LATEST"})
    with pytest.raises(SparkOptionError, match="maxRecordsPerTrigger"):
        check_options({"streamName": "orders", "maxRecordsPerTrigger": "many"})
    with pytest.raises(SparkOptionError):
        check_options({})  # no stream
