"""The README's runnable examples run as documented against the local stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.boto import lease_items, make_stream, put_records

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _preload(moto_url: str, stream: str, count: int) -> None:
    kinesis = make_stream(moto_url, stream, 2)
    put_records(
        kinesis,
        stream,
        [(f"c{i}", json.dumps({"customer": f"c{i}", "amount": i}).encode()) for i in range(count)],
    )


def _run(script: str, moto_url: str, *args: str) -> list[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_url}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def _checkpoints(moto_url: str, table: str) -> list[str]:
    return sorted(item["checkpoint"]["S"] for item in lease_items(moto_url, table).values())


def test_consume_handler_example(moto_url: str, stream_name: str) -> None:
    _preload(moto_url, stream_name, 6)
    lines = _run(
        "consume_handler.py", moto_url, stream_name, f"{stream_name}-app", "--stop-after", "6"
    )
    customers = sorted(
        json.loads(line.split(" ", 2)[2].replace("'", '"'))["customer"] for line in lines
    )
    assert customers == sorted(f"c{i}" for i in range(6))
    # The graceful stop wrote real sequence numbers as checkpoints into the KCL-format table.
    assert all(c.isdigit() for c in _checkpoints(moto_url, f"{stream_name}-app"))


def test_consume_shards_example(moto_url: str, stream_name: str) -> None:
    _preload(moto_url, stream_name, 4)
    lines = _run(
        "consume_shards.py", moto_url, stream_name, f"{stream_name}-audit", "--stop-after", "4"
    )
    assert len(lines) == 4
    assert all(c.isdigit() for c in _checkpoints(moto_url, f"{stream_name}-audit"))
