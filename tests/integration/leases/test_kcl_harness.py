"""The real-KCL harness itself: a KCL 2.5.8 MultiLangDaemon reads kinesalite through the h2c
proxy, its Python processors log every record, and SIGTERM leaves each shard checkpointed at
the last record handled. Skipped, with the reason, only where Java or the package is missing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from support.boto import boto_client, make_stream, put_records
from support.kcl import (
    KCL_2,
    H2cProxy,
    KclUnavailable,
    KclWorker,
    KclWorkerConfig,
    duplicates,
    ensure_installed,
    read_handled,
)
from support.kcl.tables import seed_lease_table

pytestmark = pytest.mark.slow


def test_kcl_2_reads_kinesalite_through_the_proxy_and_checkpoints_on_sigterm(
    kinesalite_url: str, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    try:
        install = ensure_installed(KCL_2)
    except KclUnavailable as missing:
        pytest.skip(f"not run: {missing.reason}")
    kinesis = make_stream(kinesalite_url, stream_name, 2)
    written = put_records(
        kinesis, stream_name, [(str(i), f"{i:05d}|x".encode()) for i in range(200)]
    )
    application = f"app-{stream_name}"
    seed_lease_table(moto_url, kinesalite_url, application, stream_name)

    with H2cProxy(kinesalite_url) as proxy:
        config = KclWorkerConfig(
            application, stream_name, "kcl-a", proxy.endpoint_url, moto_url, failover_ms=10_000
        )
        worker = KclWorker(install, config, tmp_path)
        worker.start()
        try:
            deadline = time.monotonic() + 90
            while len(read_handled([worker.handled_path])) < len(written):
                assert worker.running, worker.log_tail()
                assert time.monotonic() < deadline, worker.log_tail()
                time.sleep(0.5)
            assert worker.cpu_seconds() > 0
            assert worker.rss_bytes() > 0
        finally:
            worker.stop()

    handled = read_handled([worker.handled_path])
    assert {h.key for h in handled} == {f"{i:05d}" for i in range(200)}
    assert duplicates(handled) == 0
    last = {}
    for entry in written:
        last[entry["ShardId"]] = entry["SequenceNumber"]
    items = boto_client("dynamodb", moto_url).scan(TableName=application)["Items"]
    assert {i["leaseKey"]["S"]: i["checkpoint"]["S"] for i in items} == last
