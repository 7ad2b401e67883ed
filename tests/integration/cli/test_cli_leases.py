"""``shardflow leases`` against a lease table a multi-stream consumer wrote on moto."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from typer.testing import CliRunner

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.cli import app
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.fetch import Polling
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.model import Lease
from shardflow.leases.settings import LeaseSettings
from shardflow.records import ExtendedSequenceNumber
from support.boto import boto_client, make_stream, put_records

SETTINGS = ConsumerSettings(
    leases=LeaseSettings(failover_time=2.0, renew_interval=0.4, take_interval=0.5),
    fetch=Polling(idle_time=0.1),
)


def put(kinesis: Any, stream: str, count: int) -> list[str]:
    """``count`` records under keys ``k0`` onwards; returns the shard of each."""
    entries = put_records(kinesis, stream, [(f"k{i}", f"{i}".encode()) for i in range(count)])
    return [entry["ShardId"] for entry in entries]


def leases_json(url: str, application: str, *args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(
        app, ["leases", application, "--endpoint-url", url, "--format", "json", *args]
    )
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


async def test_multi_stream_leases_show_owner_checkpoint_and_lag(
    moto_url: str, stream_name: str
) -> None:
    streams = [f"{stream_name}-a", f"{stream_name}-b"]
    application = f"app-{stream_name}"
    clients = [make_stream(moto_url, name, 2) for name in streams]
    total = sum(len(put(client, name, 20)) for client, name in zip(clients, streams, strict=True))
    seen: list[ConsumedRecord[bytes]] = []
    consumer = Consumer(
        streams,
        application,
        settings=replace(SETTINGS, worker_id="the-worker"),
        aws=AwsSettings(endpoint_url=moto_url),
    )
    run = asyncio.create_task(consumer.consume(lambda r: seen.append(r)))
    try:
        async with asyncio.timeout(30):
            while len(seen) < total:  # noqa: ASYNC110 - filled by the consumer's tasks
                await asyncio.sleep(0.05)
        # While running: this worker owns every lease.
        rows = await asyncio.to_thread(leases_json, moto_url, application, "--no-lag")
        assert {row["owner"] for row in rows} == {"the-worker"}
        assert {row["lag"] for row in rows} == {None}
    finally:
        await consumer.close()
        await run

    late_shards = set(put(clients[1], streams[1], 3))
    rows = await asyncio.to_thread(leases_json, moto_url, application)
    assert len(rows) == 4
    for row in rows:
        account, stream, epoch, shard_id = row["lease_key"].split(":")
        assert stream in streams
        assert account.isdigit()
        assert epoch.isdigit()
        assert row["owner"] is None
        assert row["checkpoint"].isdigit()
        late = stream == streams[1] and shard_id in late_shards
        assert row["lag"].endswith("behind") if late else row["lag"] == "caught up", row


def test_a_missing_table_is_a_one_line_error(moto_url: str, stream_name: str) -> None:
    result = CliRunner().invoke(
        app, ["leases", f"no-such-app-{stream_name}", "--endpoint-url", moto_url]
    )
    assert result.exit_code == 1
    assert "error:" in result.output


async def test_the_stream_is_found_from_the_lease_table(moto_url: str, stream_name: str) -> None:
    application = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 1)
    put(kinesis, stream_name, 3)
    seen: list[ConsumedRecord[bytes]] = []
    consumer = Consumer(
        stream_name, application, settings=SETTINGS, aws=AwsSettings(endpoint_url=moto_url)
    )
    run = asyncio.create_task(consumer.consume(lambda r: seen.append(r)))
    try:
        async with asyncio.timeout(30):
            while len(seen) < 3:  # noqa: ASYNC110 - filled by the consumer's tasks
                await asyncio.sleep(0.05)
    finally:
        await consumer.close()
        await run
    put(kinesis, stream_name, 2)
    (row,) = await asyncio.to_thread(leases_json, moto_url, application)  # no --stream
    assert row["lag"].endswith("behind"), row


async def test_piped_output_keeps_every_value_whole_on_its_row(
    moto_url: str, stream_name: str
) -> None:
    """Not a terminal (CliRunner, a pipe): no cell is wrapped or cut, one lease per line."""
    application = f"app-{stream_name}"
    owner = "worker-on-a-host-with-a-long-name.eu-west-1.compute.internal:4242:6f1c2b9a"
    leases = [
        Lease(
            lease_key=f"123456789012:{stream_name}-with-a-long-name:1700000000:shardId-00000000000{i}",
            lease_owner=owner,
            lease_counter=40 + i,
            checkpoint=ExtendedSequenceNumber(
                f"4959033827149025660855969253836157109592157598913658889{i}"
            ),
        )
        for i in range(3)
    ]
    async with ClientFactory(AwsSettings(endpoint_url=moto_url)).dynamodb() as dynamodb:
        store = DynamoDBLeaseStore(dynamodb, application)
        await store.ensure_table()
        for lease in leases:
            await store.create_if_absent(lease)
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["leases", application, "--endpoint-url", moto_url, "--no-lag"]
    )
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()]
    for lease in leases:
        (row,) = [r for r in rows if lease.lease_key in r]
        assert owner in row
        assert lease.checkpoint.sequence_number in row


def counters(url: str, application: str) -> dict[str, int]:
    """Lease counters by key (none while the table does not exist yet)."""
    result = CliRunner().invoke(
        app, ["leases", application, "--endpoint-url", url, "--format", "json", "--no-lag"]
    )
    if result.exit_code != 0:
        return {}
    return {row["lease_key"]: row["counter"] for row in json.loads(result.stdout)}


def heartbeat_items(url: str, application: str) -> list[str]:
    ddb = boto_client("dynamodb", url)
    items = ddb.scan(TableName=application, ConsistentRead=True)["Items"]
    return [
        i["leaseKey"]["S"]
        for i in items
        if i.get("entityType", {}).get("S") == "SHARDFLOW_HEARTBEAT"
    ]


async def test_set_mode_switches_a_running_worker_to_heartbeats_and_back(
    moto_url: str, stream_name: str
) -> None:
    make_stream(moto_url, stream_name, 2)
    application = f"app-{stream_name}"
    consumer = Consumer(
        stream_name,
        application,
        settings=replace(SETTINGS, worker_id="the-worker"),
        aws=AwsSettings(endpoint_url=moto_url),
    )
    run = asyncio.create_task(consumer.consume(lambda r: None))

    def switch(mode: str) -> None:
        done = CliRunner().invoke(
            app, ["leases", application, "--endpoint-url", moto_url, "--set-mode", mode]
        )
        assert done.exit_code == 0, done.output
        assert f"lease mode of {application}: {mode}" in done.output

    async def ticking(seconds: float) -> bool:
        """Whether any lease counter moved within ``seconds`` (idle: only renewals move them)."""
        before = await asyncio.to_thread(counters, moto_url, application)
        await asyncio.sleep(seconds)
        return await asyncio.to_thread(counters, moto_url, application) != before

    try:
        async with asyncio.timeout(60):
            while len(await asyncio.to_thread(counters, moto_url, application)) < 2:  # noqa: ASYNC110 - the table is polled
                await asyncio.sleep(0.2)
        assert await ticking(1.5), "per-lease: renewed every 0.4 s"
        await asyncio.to_thread(switch, "heartbeat")
        # Established one take interval (0.5 s) + 1 s after the worker's heartbeat started.
        await asyncio.sleep(3.0)
        assert await asyncio.to_thread(heartbeat_items, moto_url, application) == [
            "_shardflow#heartbeat#the-worker"
        ]
        assert not await ticking(2.0), "heartbeat: no lease written while idle"
        # A beat that failed (moto under a loaded suite answered one late) reports per-lease
        # until its retry, 0.5-1 s later, lands.
        async with asyncio.timeout(5):
            while consumer.status().lease_mode != "heartbeat":  # noqa: ASYNC110 - a status
                await asyncio.sleep(0.1)
        await asyncio.to_thread(switch, "per-lease")
        await asyncio.sleep(1.0)
        assert await ticking(1.5), "per-lease again: renewals resumed"
        async with asyncio.timeout(10):  # the item goes failover_time after the last beat
            while await asyncio.to_thread(heartbeat_items, moto_url, application):  # noqa: ASYNC110 - the table is polled
                await asyncio.sleep(0.2)
        assert len(consumer.status().shards) == 2
        assert consumer.status().lease_mode == "per-lease"
    finally:
        await consumer.close()
        await run
