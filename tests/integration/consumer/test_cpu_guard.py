"""CPU regression guard: the consumer's CPU per record against a plain boto3 GetRecords loop.

Runs bench/consumer.py's drain in its short mode: both contenders drain the same preloaded
records from kinesalite, each in a child process of its own, rounds interleaved with the order
rotated, in this one run. Only the ratio of their CPU is judged (this machine is shared and
noisy: an absolute time would say nothing). The consumer does more than the loop (leases and
checkpoints on moto, ack tracking, prefetch, and its fixed costs weigh more in a short run)
and still spends about 0.6x the loop's CPU per record: shardflow parses GetRecords in one pass
where botocore walks its shapes, and makes one object per record. The ceiling, the loop's own
cost, leaves room for the noise of a shared machine, not for the consumer to fall back to its
old cost (1.0-2x the loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LOOP, CONSUMER = "boto3 GetRecords loop", "shardflow consumer"
CEILING = 1.0
"""Most CPU per record the consumer may spend, as a multiple of the loop's in the same run."""


@pytest.mark.slow
def test_consumer_cpu_per_record_against_the_boto3_loop(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "bench" / "consumer.py"),
        "--parts",
        "drain",
        "--records",
        "40000",
        "--repeat",
        "3",
        "--contenders",
        f"{LOOP},{CONSUMER}",
        "--no-kcl",
    ]
    env = dict(os.environ, SHARDFLOW_BENCH_RESULTS=str(tmp_path))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    drains = {
        d["contender"]: d for d in json.loads((tmp_path / "consumer.json").read_text())["drain"]
    }
    assert all(d["verified"] for d in drains.values()), drains
    ratio = drains[CONSUMER]["cpu_per_100k"] / drains[LOOP]["cpu_per_100k"]
    print(f"consumer CPU per record = {ratio:.2f}x the boto3 loop's")
    assert ratio <= CEILING, done.stdout[-2000:]
