"""Done when: amazon-kclpy's own sample application, its processor and its properties file as
the wheel installs them (written for the KCL's MultiLangDaemon), runs under ``shardflow
multilang`` with no change to either file, on the local stack that ``shardflow local up``
starts (moto for DynamoDB, kinesis-local for Kinesis: the sample's properties leave the
retrieval mode to the KCL's default, enhanced fan-out)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from support.multilang import MultiLangRun, kclpy_or_skip, wait_until

pytestmark = pytest.mark.slow

RECORDS = 60


def _shardflow(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "shardflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_kclpy_sample_app_runs_unchanged_on_the_local_stack(tmp_path: Path) -> None:
    python = kclpy_or_skip()
    samples = Path(
        subprocess.run(
            [str(python), "-c", "import samples, os; print(os.path.dirname(samples.__file__))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    sample_properties = samples / "sample.properties"
    assert (python.parent / "sample_kclpy_app.py").exists()  # the wheel puts it on the venv's PATH
    before = (sample_properties.read_bytes(), (samples / "sample_kclpy_app.py").read_bytes())

    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env["SHARDFLOW_STATE_DIR"] = str(tmp_path / "state")
    exports = _shardflow("local", "up", "--kinesis-local", "--quiet", env=env)
    try:
        for name, value in re.findall(r"^export (\w+)=(.*)$", exports, re.MULTILINE):
            env[name] = value.strip("'")
        kinesis = boto3.client("kinesis", endpoint_url=env["AWS_ENDPOINT_URL_KINESIS"])
        kinesis.create_stream(StreamName="kclpysample", ShardCount=2)
        kinesis.get_waiter("stream_exists").wait(
            StreamName="kclpysample", WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
        last: dict[str, str] = {}
        for i in range(RECORDS):
            put = kinesis.put_record(
                StreamName="kclpysample", PartitionKey=f"key-{i}", Data=f"word {i}".encode()
            )
            last[put["ShardId"]] = put["SequenceNumber"]

        # As its user runs it: the venv active, in the samples folder, the one-line change of
        # command: `java ... MultiLangDaemon --properties-file sample.properties` becomes:
        env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
        run = MultiLangRun(tmp_path, "sample", {}, env=env, cwd=samples)
        run.properties_path = sample_properties
        run.start()
        try:
            wait_until(
                lambda: all(f"Partition Key: key-{i}," in run.log() for i in range(RECORDS)),
                90,
                "every record processed by the sample",
                run,
            )
        finally:
            assert run.stop() == 0, run.log_tail()
        dynamodb = boto3.client("dynamodb", endpoint_url=env["AWS_ENDPOINT_URL_DYNAMODB"])
        items = dynamodb.scan(TableName="PythonKCLSample")["Items"]
        # The sample checkpoints when asked to shut down: at the last record of each shard.
        assert {i["leaseKey"]["S"]: i["checkpoint"]["S"] for i in items} == last
    finally:
        _shardflow("local", "down", env=env)
    assert (
        sample_properties.read_bytes(),
        (samples / "sample_kclpy_app.py").read_bytes(),
    ) == before
    log = run.log()
    assert "Shutdown has been requested, checkpointing." in log
    assert "warning:" not in log  # every key of the sample's file honoured as the KCL does
