"""``shardflow tail`` end to end against moto (boto3 writes, the CLI reads)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from typer.testing import CliRunner, Result

from shardflow.aggregation import aggregate
from shardflow.cli import app
from shardflow.testing.faults import FaultProxy
from support.boto import make_stream, put_records

PAYLOADS = [
    ("alpha", b"hello"),
    ("beta", "grüße 🙂".encode()),
    ("gamma", b"\xff\x00\x01binary"),
    ("delta", b"two\nlines\tand a tab"),
    ("epsilon", b""),
    ("zeta", b'{"json": true}'),
]


def tail(url: str, stream: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["tail", stream, "--endpoint-url", url, *args])


def test_text_lines_show_shard_position_key_and_payload(moto_url: str, stream_name: str) -> None:
    kinesis = make_stream(moto_url, stream_name, 2)
    placed = put_records(kinesis, stream_name, PAYLOADS)

    result = tail(moto_url, stream_name, "--format", "text")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(PAYLOADS)
    rows = {}
    for line in lines:
        shard, position, key, payload = line.split("\t")
        rows[key] = (shard, position, payload)
    for (key, _), entry in zip(PAYLOADS, placed, strict=True):
        assert rows[key][:2] == (entry["ShardId"], f"{entry['SequenceNumber']}/0")
    assert rows["alpha"][2] == "hello"
    assert rows["beta"][2] == "grüße 🙂"
    assert rows["gamma"][2] == "base64:" + base64.b64encode(b"\xff\x00\x01binary").decode()
    assert rows["delta"][2] == "two\\nlines\\tand a tab"
    assert rows["epsilon"][2] == ""


def test_json_lines_carry_every_field_and_the_exact_payload(
    moto_url: str, stream_name: str
) -> None:
    kinesis = make_stream(moto_url, stream_name, 2)
    placed = put_records(kinesis, stream_name, PAYLOADS)

    result = tail(moto_url, stream_name, "--format", "json")

    assert result.exit_code == 0, result.output
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    by_key = {o["partition_key"]: o for o in objects}
    assert set(by_key) == {k for k, _ in PAYLOADS}
    for (key, data), entry in zip(PAYLOADS, placed, strict=True):
        found = by_key[key]
        decoded = (
            base64.b64decode(found["data"])
            if found["encoding"] == "base64"
            else found["data"].encode()
        )
        assert decoded == data
        assert found["shard_id"] == entry["ShardId"]
        assert found["sequence_number"] == entry["SequenceNumber"]
        assert found["sub_sequence_number"] == 0
        assert found["stream_name"] == stream_name
        assert found["aggregated"] is False
        assert datetime.fromisoformat(found["approximate_arrival_timestamp"]).tzinfo is not None
    assert by_key["gamma"]["encoding"] == "base64"
    assert by_key["beta"]["encoding"] == "utf8"


def test_aggregated_records_are_shown_one_line_per_user_record(
    moto_url: str, stream_name: str
) -> None:
    kinesis = make_stream(moto_url, stream_name, 1)
    (packed,) = aggregate([(f"user-{i}", f"event-{i}".encode(), None) for i in range(3)])
    put_records(kinesis, stream_name, [(packed.partition_key, packed.data)])

    unpacked = tail(moto_url, stream_name, "--format", "json")
    raw = tail(moto_url, stream_name, "--format", "json", "--no-deaggregate")

    objects = [json.loads(line) for line in unpacked.stdout.splitlines()]
    assert [(o["partition_key"], o["data"]) for o in objects] == [
        (f"user-{i}", f"event-{i}") for i in range(3)
    ]
    assert [o["sub_sequence_number"] for o in objects] == [0, 1, 2]
    assert all(o["aggregated"] for o in objects)
    (whole,) = [json.loads(line) for line in raw.stdout.splitlines()]
    assert whole["encoding"] == "base64"
    assert base64.b64decode(whole["data"]) == packed.data


def test_limit_and_start_positions(moto_url: str, stream_name: str) -> None:
    kinesis = make_stream(moto_url, stream_name, 2)
    put_records(kinesis, stream_name, [(f"old-{i}", b"old") for i in range(5)])
    time.sleep(0.3)
    moment = datetime.now(UTC).isoformat()
    time.sleep(0.3)
    put_records(kinesis, stream_name, [(f"new-{i}", b"new") for i in range(4)])

    limited = tail(moto_url, stream_name, "--limit", "3")
    since = tail(moto_url, stream_name, "--from", moment)
    latest = tail(moto_url, stream_name, "--from", "latest")

    assert len(limited.stdout.splitlines()) == 3
    assert sorted(line.split("\t")[2] for line in since.stdout.splitlines()) == [
        f"new-{i}" for i in range(4)
    ]
    assert latest.exit_code == 0
    assert latest.stdout == ""


def test_a_bad_start_position_is_a_usage_error(moto_url: str, stream_name: str) -> None:
    result = tail(moto_url, stream_name, "--from", "yesterday")
    assert result.exit_code == 2
    assert "not a start position" in result.output


def test_follow_prints_records_written_after_catching_up(moto_url: str, stream_name: str) -> None:
    kinesis = make_stream(moto_url, stream_name, 1)
    put_records(kinesis, stream_name, [("before", b"first")])
    with FaultProxy(moto_url) as proxy:
        command = [sys.executable, "-m", "shardflow", "tail", stream_name, "--follow"]
        command += ["--limit", "3", "--idle-time", "0.05", "--endpoint-url", proxy.url]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
        )
        try:
            # Caught up: it read the first record and then polled an empty shard again.
            deadline = time.monotonic() + 30
            while proxy.forwarded("GetRecords") < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            put_records(kinesis, stream_name, [("after", b"second"), ("after", b"third")])
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0, err
    assert [line.split("\t")[3] for line in out.splitlines()] == ["first", "second", "third"]


def test_a_missing_stream_exits_non_zero_with_one_line(moto_url: str, stream_name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shardflow", "tail", stream_name, "--endpoint-url", moto_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error:")
    assert "ResourceNotFoundException" in lines[0]
    assert "Traceback" not in done.stderr
