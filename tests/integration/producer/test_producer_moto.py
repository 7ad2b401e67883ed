"""The producer against moto's server over HTTP, read back with plain boto3 GetRecords."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from shardflow.aws import AwsSettings
from shardflow.errors import ProducerClosedError, ResourceNotFoundError
from shardflow.producer import (
    Producer,
    ProducerCollector,
    ProducerSettings,
    PutResult,
    SyncProducer,
)
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy
from support.boto import make_stream, user_records

SHARDS = 4
# moto's server numbers a shard's records as "last + 1" without a lock: two PutRecords calls
# handled at once by its threads can give two records one sequence number, and one of them is
# lost. One call at a time keeps moto correct; concurrency is covered by the unit tests.
ONE_CALL_AT_A_TIME = {"max_concurrent_requests": 1}


@dataclass(frozen=True)
class Landed:
    """A user record as a consumer reads it."""

    partition_key: str
    data: bytes
    shard_id: str
    sequence_number: str
    sub_sequence_number: int
    aggregated: bool


@pytest.fixture
def stream(moto_url: str, stream_name: str) -> str:
    make_stream(moto_url, stream_name, SHARDS)
    return stream_name


def read_back(url: str, stream: str) -> list[Landed]:
    """Every user record of every shard, in shard order, aggregates unpacked."""
    return [
        Landed(
            r.partition_key,
            r.data,
            r.shard_id,
            r.sequence_number,
            r.sub_sequence_number,
            r.aggregated,
        )
        for r in user_records(url, stream)
    ]


def numbered(count: int, keys: int) -> list[tuple[bytes, str]]:
    """``(data, key)`` pairs; data names its key and its rank among all records."""
    return [
        (f"{i:06d}|key-{i % keys}|".encode().ljust(60, b"."), f"key-{i % keys}")
        for i in range(count)
    ]


def rank(data: bytes) -> int:
    return int(data.split(b"|")[0])


def check_read_back(
    landed: list[Landed],
    put: list[tuple[bytes, str]],
    results: list[PutResult],
    *,
    key_order: bool,
) -> None:
    # The same records, each once.
    assert Counter(r.data for r in landed) == Counter(data for data, _ in put)
    by_data = {r.data: r for r in landed}
    for (data, key), result in zip(put, results, strict=True):
        record = by_data[data]
        # Where the result says, under its own key.
        assert record.partition_key == key
        assert (record.shard_id, record.sequence_number, record.sub_sequence_number) == (
            result.shard_id,
            result.sequence_number,
            result.sub_sequence_number,
        )
        assert record.aggregated == result.aggregated
    if key_order:
        per_key: dict[str, list[int]] = defaultdict(list)
        for record in landed:  # read order = stream order within each shard
            per_key[record.partition_key].append(rank(record.data))
        for key, ranks in per_key.items():
            assert ranks == sorted(ranks), f"records of {key} out of order"


@pytest.mark.parametrize(
    ("aggregate", "key_order"),
    [(False, False), (False, True), (True, True)],
    ids=["plain", "plain-ordered", "aggregated-ordered"],
)
async def test_records_are_all_written_where_the_results_say(
    moto_url: str, stream: str, aggregate: bool, key_order: bool
) -> None:
    put = numbered(3_000, keys=60)
    settings = ProducerSettings(
        aggregate=aggregate,
        preserve_key_order=key_order,
        aggregation_max_bytes=16 * 1024,  # several aggregates per shard
        shard_records_per_second=20_000,  # moto enforces no limits; keep the test short
        **ONE_CALL_AT_A_TIME,
    )
    async with Producer(
        stream, settings=settings, aws=AwsSettings(endpoint_url=moto_url)
    ) as producer:
        futures = await producer.put_many((data, key) for data, key in put)
        await producer.flush()
        assert all(future.done() for future in futures)
        results = [future.result() for future in futures]
        # The producer predicted each record's shard right.
        for (_, key), result in zip(put, results, strict=True):
            assert producer.predict_shard(key) == result.shard_id
        snapshot = producer.metrics()

    assert {r.shard_id for r in results} == {f"shardId-{i:012d}" for i in range(SHARDS)}
    assert all(r.sequence_number.isdigit() and r.attempts == 1 for r in results)
    assert any(r.aggregated for r in results) == aggregate
    check_read_back(read_back(moto_url, stream), put, results, key_order=key_order)
    assert snapshot.records_succeeded == 3_000
    assert snapshot.records_failed == 0
    if aggregate:
        assert snapshot.put_records_calls < 30


async def test_a_tiny_buffer_still_delivers_everything(moto_url: str, stream: str) -> None:
    put = numbered(800, keys=10)
    settings = ProducerSettings(
        buffer_max_records=8, buffer_max_bytes=1024 * 1024, linger=0.001, **ONE_CALL_AT_A_TIME
    )
    async with Producer(
        stream, settings=settings, aws=AwsSettings(endpoint_url=moto_url)
    ) as producer:
        futures = [await producer.put(data, key) for data, key in put]
        results = await asyncio.gather(*futures)
    check_read_back(read_back(moto_url, stream), put, results, key_order=False)


async def test_close_delivers_every_accepted_record(moto_url: str, stream: str) -> None:
    put = numbered(1_000, keys=20)
    producer = Producer(
        stream,
        settings=ProducerSettings(linger=60.0, **ONE_CALL_AT_A_TIME),  # nothing leaves before close
        aws=AwsSettings(endpoint_url=moto_url),
    )
    await producer.start()
    futures = await producer.put_many(put)
    assert not any(future.done() for future in futures)
    await producer.close()
    results = [future.result() for future in futures]
    check_read_back(read_back(moto_url, stream), put, results, key_order=False)
    with pytest.raises(ProducerClosedError):
        await producer.put(b"late", "k")


async def test_a_wrong_stream_name_fails_fast_at_start(moto_url: str, stream_name: str) -> None:
    started = time.monotonic()
    with pytest.raises(ResourceNotFoundError) as caught:
        async with Producer(f"{stream_name}-missing", aws=AwsSettings(endpoint_url=moto_url)):
            pytest.fail("the producer started")
    assert time.monotonic() - started < 5
    assert caught.value.stream == f"{stream_name}-missing"


def test_sync_producer_round_trip(moto_url: str, stream: str) -> None:
    put = numbered(1_000, keys=15)
    settings = ProducerSettings(**ONE_CALL_AT_A_TIME)
    with SyncProducer(
        stream, settings=settings, aws=AwsSettings(endpoint_url=moto_url)
    ) as producer:
        futures = [producer.put(data, key) for data, key in put[:500]]
        futures += producer.put_many(put[500:])
        producer.flush()
        assert all(future.done() for future in futures)
        snapshot = producer.metrics()
        registry = CollectorRegistry()
        registry.register(ProducerCollector(producer))  # scraped from this thread, not the loop's
        exported = generate_latest(registry).decode()
    assert f'shardflow_producer_records_succeeded_total{{stream="{stream}"}} 1000.0' in exported
    results = [future.result(timeout=0) for future in futures]
    assert snapshot.records_succeeded == 1_000
    check_read_back(read_back(moto_url, stream), put, results, key_order=False)
    with pytest.raises(ProducerClosedError):
        producer.put(b"late", "k")


# A producer left open at exit, on connections that are never reused: every request opens a
# new connection, which resolves its host in the loop's thread pool, so the exit flush only
# works if it runs before Python shuts the thread pools down.
LEFT_OPEN = """
import sys
from typing import Any
from shardflow.aws import AwsSettings, ClientFactory
from shardflow.producer import ProducerSettings, SyncProducer

class FreshConnections(ClientFactory):
    def config(self, **overrides: Any) -> Any:
        args = {"keepalive_timeout": 0.001, "use_dns_cache": False}
        return super().config(connector_args=args, **overrides)

url, stream, exit_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
producer = SyncProducer(
    stream,
    settings=ProducerSettings(linger=60.0),
    clients=FreshConnections(AwsSettings(endpoint_url=url)),
    exit_timeout=exit_timeout,
)
producer.start()
for i in range(300):
    producer.put(f"{i}".encode(), f"k{i % 7}")
# no close: the interpreter exits with everything still lingering in the buffer
"""


def leave_open(url: str, stream: str, exit_timeout: float) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", LEFT_OPEN, url, stream, str(exit_timeout)],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_sync_producer_left_open_delivers_at_interpreter_exit(moto_url: str, stream: str) -> None:
    done = leave_open(moto_url.replace("127.0.0.1", "localhost"), stream, 30.0)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(int(r.data) for r in read_back(moto_url, stream)) == list(range(300))
    assert b"could not be delivered" not in done.stderr


def test_sync_producer_left_open_says_what_it_could_not_deliver(moto_url: str, stream: str) -> None:
    with FaultProxy(moto_url) as proxy:
        proxy.add(ErrorResponse(INTERNAL_FAILURE), operation="PutRecords")
        done = leave_open(proxy.url, stream, 2.0)
    assert done.returncode == 0, done.stderr.decode()
    assert read_back(moto_url, stream) == []
    assert b"300 record(s) put on " + stream.encode() in done.stderr, done.stderr.decode()
    assert b"before the interpreter exit could not be delivered" in done.stderr


def test_sync_producer_reports_a_wrong_stream_at_start(moto_url: str, stream_name: str) -> None:
    producer = SyncProducer(f"{stream_name}-missing", aws=AwsSettings(endpoint_url=moto_url))
    with pytest.raises(ResourceNotFoundError):
        producer.start()


def run_cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shardflow", "produce", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


def test_cli_produce_with_key_field_and_aggregation(
    moto_url: str, stream: str, tmp_path: Path
) -> None:
    lines = [json.dumps({"user": f"u{i % 13}", "n": i}) for i in range(2_000)]
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(lines) + "\n")

    done = run_cli(
        stream, "--file", str(source), "--key-field", "user", "--aggregate",
        "--endpoint-url", moto_url,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr.decode()
    assert "2,000 records delivered" in done.stderr.decode()
    landed = read_back(moto_url, stream)
    assert Counter(r.data.decode() for r in landed) == Counter(lines)
    assert all(r.partition_key == json.loads(r.data)["user"] for r in landed)
    assert any(r.aggregated for r in landed)


def test_cli_produce_reports_failures_and_exits_non_zero(moto_url: str, stream: str) -> None:
    stdin = b'{"user": "a"}\nnot json\n{"user": "b"}\n{"other": 1}\n'

    done = run_cli(stream, "--key-field", "user", "--endpoint-url", moto_url, stdin=stdin)

    assert done.returncode == 1
    report = done.stderr.decode()
    assert "2 records delivered" in report
    assert "LineKeyError" in report
    assert sorted(r.data for r in read_back(moto_url, stream)) == [
        b'{"user": "a"}',
        b'{"user": "b"}',
    ]


def test_cli_produce_to_a_missing_stream_fails(moto_url: str, stream_name: str) -> None:
    done = run_cli(
        f"{stream_name}-missing", "--random-key", "--endpoint-url", moto_url, stdin=b"x\n"
    )
    assert done.returncode == 1
    assert "not found" in done.stderr.decode()
