"""The embedded local stack against the real emulators: start, serve AWS SDK calls, stop."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from shardflow.errors import NodeModulesNotFoundError
from shardflow.local import (
    KinesaliteServer,
    KinesisLocalServer,
    LocalServer,
    LocalStack,
    MotoServer,
)
from shardflow.local import server as server_module
from shardflow.local.process import is_alive
from shardflow.local.state import read_state, state_file

SERVER_CLASSES = [MotoServer, KinesisLocalServer, KinesaliteServer]
SHARDFLOW = Path(sys.executable).with_name("shardflow")


def kinesis(endpoint_url: str | None = None) -> Any:
    return boto3.client("kinesis", endpoint_url=endpoint_url)


def put_and_get_one_record(client: Any, stream: str) -> bytes:
    """Create a one-shard stream, write one record, read it back from the shard's start."""
    client.create_stream(StreamName=stream, ShardCount=1)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    written = client.put_record(StreamName=stream, Data=b"hello local", PartitionKey="k")
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=written["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = client.get_records(ShardIterator=iterator)["Records"]
    assert [r["SequenceNumber"] for r in records] == [written["SequenceNumber"]]
    data: bytes = records[0]["Data"]
    return data


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of sockets listening on ``port``."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine other than 127.x, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
@pytest.mark.parametrize("server_class", SERVER_CLASSES, ids=lambda c: c.name)
def test_server_serves_kinesis_on_loopback_only_and_stops(
    server_class: type[LocalServer], stream_name: str, tmp_path: Path
) -> None:
    with server_class(log_dir=tmp_path) as server:
        pid, port = server.pid, server.port
        assert server.endpoint_url == f"http://127.0.0.1:{port}"
        assert put_and_get_one_record(kinesis(server.endpoint_url), stream_name) == b"hello local"
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else (no ::)
        other = non_loopback_ipv4()
        if other is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((other, port), timeout=1).close()
    assert not is_alive(pid)
    assert listening_addresses(port) == set()


def test_session_servers_answer_the_sdk(
    moto_url: str, kinesis_local_url: str, kinesalite_url: str, stream_name: str
) -> None:
    for url in (moto_url, kinesis_local_url, kinesalite_url):
        assert put_and_get_one_record(kinesis(url), stream_name) == b"hello local"


def test_moto_serves_dynamodb_streams_and_cloudwatch(moto_url: str, stream_name: str) -> None:
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_url)
    dynamodb.create_table(
        TableName=stream_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    dynamodb.put_item(TableName=stream_name, Item={"leaseKey": {"S": "shardId-000000000000"}})
    stream_arn = dynamodb.describe_table(TableName=stream_name)["Table"]["LatestStreamArn"]
    streams = boto3.client("dynamodbstreams", endpoint_url=moto_url)
    shard = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"][0]
    iterator = streams.get_shard_iterator(
        StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    assert [r["eventName"] for r in streams.get_records(ShardIterator=iterator)["Records"]] == [
        "INSERT"
    ]

    cloudwatch = boto3.client("cloudwatch", endpoint_url=moto_url)
    cloudwatch.put_metric_data(
        Namespace=stream_name, MetricData=[{"MetricName": "Records", "Value": 3.0}]
    )
    metrics = cloudwatch.list_metrics(Namespace=stream_name)["Metrics"]
    assert [m["MetricName"] for m in metrics] == ["Records"]


def test_kinesis_local_tls_listener_is_on_loopback_only(
    kinesis_local_server: KinesisLocalServer,
) -> None:
    assert listening_addresses(kinesis_local_server.tls_port) == {"0100007F"}


def test_stack_env_sends_each_service_where_it_is_served(
    monkeypatch: pytest.MonkeyPatch, stream_name: str, tmp_path: Path
) -> None:
    with LocalStack(moto=True, kinesalite=True, log_dir=tmp_path) as stack:
        env = stack.env()
        assert env["AWS_ENDPOINT_URL"] == stack.moto.endpoint_url
        assert env["SHARDFLOW_KINESALITE_URL"] == stack.kinesalite.endpoint_url
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        kinesis().create_stream(StreamName=stream_name, ShardCount=1)  # no endpoint_url given
        boto3.client("dynamodb").create_table(
            TableName=stream_name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        on_moto = kinesis(stack.moto.endpoint_url).list_streams()["StreamNames"]
        on_kinesalite = kinesis(stack.kinesalite.endpoint_url).list_streams()["StreamNames"]
        assert stream_name not in on_moto
        assert stream_name in on_kinesalite  # Kinesis traffic reached the Kinesis it asked for
        tables = boto3.client("dynamodb", endpoint_url=stack.moto.endpoint_url).list_tables()
        assert stream_name in tables["TableNames"]  # and DynamoDB's reached moto
        pids = [server.pid for server in stack.servers]
    assert not any(is_alive(pid) for pid in pids)


def test_stack_that_fails_to_start_leaves_nothing_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    real_spawn: Callable[..., subprocess.Popen[bytes]] = server_module.spawn

    def recording_spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process = real_spawn(*args, **kwargs)
        spawned.append(process)
        return process

    monkeypatch.setattr(server_module, "spawn", recording_spawn)
    empty = tmp_path / "empty-node-modules"
    empty.mkdir()
    monkeypatch.setenv("SHARDFLOW_NODE_MODULES", str(empty))
    stack = LocalStack(moto=True, kinesis_local=True, log_dir=tmp_path)
    with pytest.raises(NodeModulesNotFoundError, match="npm ci"):
        stack.start()
    assert [p.args[2] for p in spawned] == [
        "shardflow.local.moto_serial"
    ]  # moto was running already...
    assert not is_alive(spawned[0].pid)  # ...and was stopped


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SHARDFLOW), "local", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.skipif(not SHARDFLOW.exists(), reason="the shardflow script is not installed")
def test_cli_up_status_down_round_trip(tmp_path: Path, stream_name: str) -> None:
    state_dir = str(tmp_path / "state")
    started = run_cli("up", "--kinesis-local", "--kinesalite", "--quiet", "--state-dir", state_dir)
    assert started.returncode == 0, started.stderr
    try:
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines()
        )
        records = read_state(state_file(Path(state_dir)))
        assert records is not None
        assert {r.name for r in records} == {"moto", "kinesis-local", "kinesalite"}
        # The servers outlived the `up` process that started them.
        assert all(is_alive(r.pid) for r in records)
        by_name = {r.name: r for r in records}
        assert exports["AWS_ENDPOINT_URL"] == by_name["moto"].endpoint_url
        assert exports["SHARDFLOW_KINESIS_LOCAL_URL"] == by_name["kinesis-local"].endpoint_url
        assert put_and_get_one_record(kinesis(exports["AWS_ENDPOINT_URL"]), stream_name)

        again = run_cli("up", "--quiet", "--state-dir", state_dir)  # idempotent
        assert again.returncode == 0, again.stderr
        assert again.stdout == started.stdout
        unlike = run_cli("up", "--no-moto", "--kinesalite", "--state-dir", state_dir)
        assert unlike.returncode == 0  # what it asks for runs already
        other = run_cli("down", "--state-dir", str(tmp_path / "elsewhere"))
        assert "No local stack" in other.stdout

        status = run_cli("status", "--state-dir", state_dir)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("ready") == 3
    finally:
        stopped = run_cli("down", "--state-dir", state_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.count(": stopped") == 3
    assert not any(is_alive(r.pid) for r in records)
    assert not state_file(Path(state_dir)).exists()
    assert run_cli("status", "--state-dir", state_dir).returncode == 1


def test_server_stops_even_when_sigterm_is_not_enough(tmp_path: Path) -> None:
    # An SDK connection kept open makes kinesis-local's graceful shutdown wait forever.
    with KinesisLocalServer(log_dir=tmp_path, stop_timeout=0.5) as server:
        client = kinesis(server.endpoint_url)
        client.list_streams()
        pid = server.pid
        began = time.monotonic()
    assert not is_alive(pid)
    assert time.monotonic() - began < 5
    client.close()
