"""``shardflow stream ...`` end to end against emulators (boto3 checks what really happened)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner, Result

from shardflow.cli import app
from shardflow.shards import MAX_HASH_KEY, ShardInfo
from shardflow.testing.faults import ErrorResponse, FaultProxy
from support.boto import boto_client


def shardflow(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), input=input)


def exists(url: str, stream: str) -> bool:
    kinesis = boto_client("kinesis", url)
    try:
        kinesis.describe_stream_summary(StreamName=stream)
    except kinesis.exceptions.ResourceNotFoundException:
        return False
    return True


def shards_of(url: str, stream: str) -> list[ShardInfo]:
    raw = boto_client("kinesis", url).list_shards(StreamName=stream)["Shards"]
    return [ShardInfo.from_api(s) for s in raw]


def test_create_list_describe_delete(moto_url: str, stream_name: str) -> None:
    endpoint = ("--endpoint-url", moto_url)

    created = shardflow("stream", "create", stream_name, "--shards", "3", *endpoint)
    assert created.exit_code == 0, created.output
    assert f"created stream {stream_name}" in created.stdout
    assert "3 open shards" in created.stdout
    shards = shards_of(moto_url, stream_name)
    assert len(shards) == 3

    listed = shardflow("stream", "list", *endpoint)
    assert listed.exit_code == 0, listed.output
    line = next(x for x in listed.stdout.splitlines() if stream_name in x)
    assert "ACTIVE" in line

    described = shardflow("stream", "describe", stream_name, *endpoint)
    assert described.exit_code == 0, described.output
    text = described.stdout
    for expected in ("ACTIVE", "PROVISIONED", "24 hours", "open shards  3"):
        assert expected in text
    for shard in shards:
        row = next(x for x in text.splitlines() if x.startswith(shard.shard_id))
        assert "open" in row
        assert str(shard.hash_range.start) in row
        assert str(shard.hash_range.end) in row
    assert str(MAX_HASH_KEY) in text

    deleted = shardflow("stream", "delete", stream_name, "--yes", *endpoint)
    assert deleted.exit_code == 0, deleted.output
    assert not exists(moto_url, stream_name)


def test_on_demand_streams_and_conflicting_options(moto_url: str, stream_name: str) -> None:
    both = shardflow(
        "stream", "create", stream_name, "--shards", "2", "--on-demand", "--endpoint-url", moto_url
    )
    assert both.exit_code == 1
    assert "either --shards or --on-demand" in both.stderr
    assert not exists(moto_url, stream_name)

    created = shardflow("stream", "create", stream_name, "--on-demand", "--endpoint-url", moto_url)
    assert created.exit_code == 0, created.output
    described = shardflow("stream", "describe", stream_name, "--endpoint-url", moto_url)
    assert "ON_DEMAND" in described.stdout


def test_delete_asks_first(moto_url: str, stream_name: str) -> None:
    boto_client("kinesis", moto_url).create_stream(StreamName=stream_name, ShardCount=1)
    refused = shardflow("stream", "delete", stream_name, "--endpoint-url", moto_url, input="n\n")
    assert refused.exit_code == 1
    assert exists(moto_url, stream_name)


def test_split_merge_and_uniform_scaling(kinesis_local_url: str, stream_name: str) -> None:
    endpoint = ("--endpoint-url", kinesis_local_url)
    assert shardflow("stream", "create", stream_name, "--shards", "2", *endpoint).exit_code == 0
    first = shards_of(kinesis_local_url, stream_name)[0]

    split = shardflow("stream", "reshard", stream_name, "--split", first.shard_id, *endpoint)
    assert split.exit_code == 0, split.output
    assert "3 open shards" in split.stdout
    after_split = shards_of(kinesis_local_url, stream_name)
    children = sorted((s for s in after_split if s.parent_ids), key=lambda s: s.hash_range.start)
    assert [c.parent_ids for c in children] == [(first.shard_id,), (first.shard_id,)]
    assert children[1].hash_range.start == (first.hash_range.start + first.hash_range.end + 1) // 2
    assert not next(s for s in after_split if s.shard_id == first.shard_id).is_open

    merge = shardflow(
        "stream", "reshard", stream_name, "--merge", children[0].shard_id, children[1].shard_id,
        *endpoint,
    )  # fmt: skip
    assert merge.exit_code == 0, merge.output
    merged = [s for s in shards_of(kinesis_local_url, stream_name) if len(s.parent_ids) == 2]
    assert len(merged) == 1
    assert set(merged[0].parent_ids) == {c.shard_id for c in children}

    scaled = shardflow("stream", "reshard", stream_name, "--target", "4", *endpoint)
    assert scaled.exit_code == 0, scaled.output
    assert sum(s.is_open for s in shards_of(kinesis_local_url, stream_name)) == 4

    described = shardflow("stream", "describe", stream_name, *endpoint)
    closed_rows = [x for x in described.stdout.splitlines() if " closed " in x]
    assert any(first.shard_id in row for row in closed_rows)
    parent_row = next(x for x in described.stdout.splitlines() if x.startswith(merged[0].shard_id))
    assert all(c.shard_id in parent_row for c in children)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--target", "2", "--split", "shardId-000000000000"), "exactly one of"),
        (("--split", "shardId-000000000099"), "no shard shardId-000000000099"),
        (("--split", "shardId-000000000000", "--at", "12abc"), "decimal hash key"),
        (("--split", "shardId-000000000000", "--at", "0"), "must lie within"),
        (("--at", "5"), "exactly one of"),
    ],
)
def test_reshard_refuses_bad_requests_clearly(
    moto_url: str, stream_name: str, options: tuple[str, ...], message: str
) -> None:
    boto_client("kinesis", moto_url).create_stream(StreamName=stream_name, ShardCount=1)
    result = shardflow("stream", "reshard", stream_name, *options, "--endpoint-url", moto_url)
    assert result.exit_code == 1
    assert message in result.stderr
    assert len(shards_of(moto_url, stream_name)) == 1


def test_access_denied_is_one_clear_line(moto_url: str, stream_name: str) -> None:
    boto_client("kinesis", moto_url).create_stream(StreamName=stream_name, ShardCount=1)
    with FaultProxy(moto_url) as proxy:
        proxy.add(ErrorResponse("AccessDeniedException"), operation="DescribeStreamSummary")
        result = shardflow("stream", "describe", stream_name, "--endpoint-url", proxy.url)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert "AccessDeniedException" in lines[0]
    assert "check the credentials" in lines[0]


def test_a_missing_stream_exits_non_zero_without_a_traceback(
    moto_url: str, stream_name: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardflow",
            "stream",
            "describe",
            stream_name,
            "--endpoint-url",
            moto_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error:")
    assert stream_name in lines[0]
    assert "check the name" in lines[0]
    assert "Traceback" not in done.stderr


def test_creating_a_stream_that_exists_fails_at_once(moto_url: str, stream_name: str) -> None:
    boto_client("kinesis", moto_url).create_stream(StreamName=stream_name, ShardCount=1)
    with FaultProxy(moto_url) as proxy:
        again = shardflow("stream", "create", stream_name, "--endpoint-url", proxy.url)
        assert proxy.forwarded("CreateStream") == 1  # not retried
    assert again.exit_code == 1
    assert f"stream {stream_name} already exists" in again.stderr
