"""The README's runnable examples run as documented against the local stack."""

from __future__ import annotations

import base64
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


def test_consume_parallel_example(moto_url: str, stream_name: str, tmp_path: Path) -> None:
    kinesis = make_stream(moto_url, stream_name, 2)
    orders = [("c1", 10), ("c2", 5), ("c1", -1), ("c3", 7), ("c1", 4), ("c2", 6)]
    put_records(
        kinesis,
        stream_name,
        [(c, json.dumps({"customer": c, "amount": a}).encode()) for c, a in orders],
    )
    letters = tmp_path / "dlq.jsonl"
    app = f"{stream_name}-parallel"
    lines = _run(
        "consume_parallel.py",
        moto_url,
        stream_name,
        app,
        "--dead-letters",
        str(letters),
        "--stop-after",
        "6",
    )
    handled = [line.split() for line in lines]
    assert sorted(handled) == sorted([c, str(a)] for c, a in orders if a >= 0)
    c1 = [amount for customer, amount in handled if customer == "c1"]
    assert c1 == ["10", "4"]  # one customer's orders in order
    (letter,) = [json.loads(line) for line in letters.read_text().splitlines()]
    assert json.loads(base64.b64decode(letter["data"])) == {"customer": "c1", "amount": -1}
    assert letter["origin"]["stream"] == stream_name
    assert letter["attempts"] == 3
    assert letter["error"] == {"type": "ValueError", "message": "negative amount -1"}
    # The record in the dead letters was acknowledged: the checkpoints reached every record.
    assert all(c.isdigit() for c in _checkpoints(moto_url, app))
    shown = subprocess.run(
        [sys.executable, "-m", "shardflow", "dlq", "show", f"file:{letters}", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "negative amount -1" in shown.stdout
