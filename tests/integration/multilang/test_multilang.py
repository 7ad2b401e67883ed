"""``shardflow multilang`` with amazon-kclpy's own processor library (v3 and v2 interfaces) as
real child processes, Kinesis and the lease table on moto's server over HTTP.

The processors (``support/kcl/behaving.py``) log every record and life-cycle event; the tests
read those logs and the lease table, never the daemon's internals.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from support.boto import boto_client, make_stream, put_records
from support.kcl.handled import Handled, duplicated, read_events, read_handled
from support.multilang import (
    BEHAVING,
    NODE_PROCESSOR,
    RECORDING,
    REPO,
    MultiLangRun,
    kclpy_or_skip,
    start_worker,
    wait_until,
)

pytestmark = pytest.mark.slow

RECORDS = 240


def _write(url: str, stream: str, shards: int) -> dict[str, list[tuple[str, str]]]:
    """RECORDS records ``<id>|payload`` (id as key too); per shard, (key, sequence) in order."""
    kinesis = make_stream(url, stream, shards)
    written: dict[str, list[tuple[str, str]]] = {}
    for start in range(0, RECORDS, 80):
        items = [(f"{i:05d}", f"{i:05d}|payload".encode()) for i in range(start, start + 80)]
        for (key, _), entry in zip(items, put_records(kinesis, stream, items), strict=True):
            written.setdefault(entry["ShardId"], []).append((key, entry["SequenceNumber"]))
    return written


def _checkpoints(url: str, table: str) -> dict[str, str]:
    dynamodb = boto_client("dynamodb", url)
    try:
        items = dynamodb.scan(TableName=table)["Items"]
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}  # not created yet
    return {item["leaseKey"]["S"]: item["checkpoint"]["S"] for item in items}


def test_kclpy_v3_processors_checkpoint_mid_batch_and_one_that_exits_restarts_from_its_checkpoint(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    python = kclpy_or_skip()
    written = _write(moto_url, stream_name, 2)
    failing_shard, other_shard = sorted(written)
    exit_key = written[failing_shard][len(written[failing_shard]) // 2][0]
    out = tmp_path / "w1.handled"
    processor = (
        f"{python} {BEHAVING} --out {out} --worker w1 --midbatch --refused-checkpoint "
        f"--exit-on {exit_key}"
    )
    app = f"app-{stream_name}"
    run = start_worker(
        tmp_path,
        "w1",
        processor=processor,
        stream=stream_name,
        kinesis=moto_url,
        dynamodb=moto_url,
        maxRecords="25",
    )
    try:
        keys = {key for records in written.values() for key, _ in records}
        wait_until(
            lambda: {h.key for h in read_handled([out])} >= keys, 60, "every record handled", run
        )
    finally:
        assert run.stop() == 0, run.log_tail()

    handled = read_handled([out])
    events = read_events([out])
    by_shard: dict[str, list[str]] = {}
    for event in events:
        by_shard.setdefault(event.shard, []).append(event.event)
    # The processor that exited was started again (initialize twice), the other one never.
    assert by_shard[failing_shard].count("initialize") == 2
    assert by_shard[other_shard].count("initialize") == 1
    # The lifecycle as the KCL orders it; the stop: shutdownRequested, then leaseLost.
    for shard in written:
        assert by_shard[shard][0] == "initialize"
        ending = by_shard[shard][by_shard[shard].index("shutdown-requested") :]
        assert ending[-1] == "lease-lost"
        assert set(ending[1:-1]) <= {"checkpoint"}  # checkpointed what it had, then lost it
    # Checkpoints beyond the last record delivered are refused by the KCL's name.
    refused = [e.detail for e in events if e.event == "checkpoint-error"]
    assert refused
    assert all(detail.startswith("IllegalArgumentException") for detail in refused)
    # The restart began at the last checkpoint: only records after it were handled again.
    restart = [e for e in events if e.shard == failing_shard and e.event == "initialize"][1]
    resumed_after = restart.detail.split("/")[0]
    order = [seq for _, seq in written[failing_shard]]
    assert resumed_after in order
    again = [h for h, n in Counter(h.position for h in handled).items() if n > 1]
    assert all(order.index(seq) > order.index(resumed_after) for _, seq, _ in again)
    assert all(shard == failing_shard for shard, _, _ in again)
    # Nothing lost, and each shard's checkpoint is its last record (shutdownRequested).
    assert {h.key for h in handled} == keys
    assert _checkpoints(moto_url, app) == {s: records[-1][1] for s, records in written.items()}
    # The processor's stderr is in the log with its shard id; the restart is said.
    log = run.log()
    assert f"[{failing_shard}] exiting on record {exit_key}" in log
    assert "starting it again from checkpoint" in log


def test_kclpy_v2_processors_that_raise_or_hang_go_on_and_stop_as_zombies(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    python = kclpy_or_skip()
    written = _write(moto_url, stream_name, 2)
    first, second = sorted(written)
    raise_key = written[first][len(written[first]) // 3][0]
    hang_key = written[second][len(written[second]) // 3][0]
    out = tmp_path / "w1.handled"
    processor = (
        f"{python} {BEHAVING} --out {out} --worker w1 --interface v2 --checkpoint-batches "
        f"--raise-on {raise_key} --hang-on {hang_key}"
    )
    app = f"app-{stream_name}"
    run = start_worker(
        tmp_path,
        "w1",
        processor=processor,
        stream=stream_name,
        kinesis=moto_url,
        dynamodb=moto_url,
        maxRecords="25",
        timeoutInSeconds="2",
    )
    try:
        last = {shard: records[-1][1] for shard, records in written.items()}
        wait_until(lambda: _checkpoints(moto_url, app) == last, 60, "both shards checkpointed", run)
    finally:
        assert run.stop() == 0, run.log_tail()

    events = read_events([out])
    log = run.log()
    # kclpy reports a processor's exception on stderr and answers anyway (as under the KCL):
    # the daemon logs it with the shard id and the shard goes on.
    assert (
        f"[{first}] Caught exception from action dispatch: cannot handle record {raise_key}" in log
    )
    # The processor that hung was killed after timeoutInSeconds and started again from its
    # last checkpoint: the record it hung on was handled after all.
    assert "did not answer within 2.0s" in log
    assert raise_key not in {h.key for h in read_handled([out])}  # kclpy swallowed its batch
    assert hang_key in {h.key for h in read_handled([out])}
    # (at least once more: on a loaded machine a slow batch may pass the 2 s too)
    assert [e.event for e in events if e.shard == second].count("initialize") >= 2
    # v2 processors hear a stop as shutdown_requested, then shutdown(ZOMBIE).
    for shard in written:
        tail = [(e.event, e.detail) for e in events if e.shard == shard][-2:]
        assert tail == [("shutdown-requested", ""), ("shutdown", "ZOMBIE")]


def test_a_rolling_restart_of_two_workers_handles_no_record_twice(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """Two workers, each replaced in turn while records keep coming: every lease moves by
    planned handoff after its processor checkpointed in shutdownRequested."""
    python = kclpy_or_skip()
    kinesis = make_stream(moto_url, stream_name, 4)
    stop_writing = threading.Event()
    written: list[str] = []

    def produce() -> None:
        index = 0
        while not stop_writing.is_set() and index < 20_000:  # bounded: ~100 records/s
            items = [(f"{i:06d}", f"{i:06d}|x".encode()) for i in range(index, index + 10)]
            put_records(kinesis, stream_name, items)
            written.extend(key for key, _ in items)
            index += 10
            time.sleep(0.1)

    def worker(name: str) -> MultiLangRun:
        out = tmp_path / f"{name}.handled"
        processor = f"{python} {RECORDING} --out {out} --worker {name} --checkpoint-every 50"
        run = start_worker(
            tmp_path,
            name,
            processor=processor,
            stream=stream_name,
            kinesis=moto_url,
            dynamodb=moto_url,
            failoverTimeMillis="10000",  # the KCL's: leases move by handoff, not expiry
        )
        return run

    def handled_by(*names: str) -> list[Handled]:
        return read_handled([tmp_path / f"{name}.handled" for name in names])

    writer = threading.Thread(target=produce, daemon=True)
    runs = {name: worker(name) for name in ("a", "b")}
    writer.start()
    try:
        wait_until(
            lambda: {h.worker for h in handled_by("a", "b")} == {"a", "b"}, 30, "a and b work"
        )
        for old, new in (("a", "a2"), ("b", "b2")):
            runs[new] = worker(new)
            time.sleep(2.0)  # the new worker is up and renewing (it has nothing to take yet)
            assert runs[old].stop() == 0, runs[old].log_tail()
            wait_until(
                lambda n=new: any(h.worker == n for h in handled_by(n)),
                30,
                f"{new} works",
                runs[new],
            )
        stop_writing.set()
        writer.join(10)
        everything = set(written)
        wait_until(
            lambda: {h.key for h in handled_by("a", "b", "a2", "b2")} >= everything,
            30,
            "every record handled",
        )
    finally:
        stop_writing.set()
        for run in runs.values():
            run.stop()
    handled = handled_by("a", "b", "a2", "b2")
    assert {h.key for h in handled} == set(written)
    assert duplicated(handled) == []
    assert len(written) > 500


def test_a_node_js_processor_on_aws_kcl_speaks_the_same_protocol(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    node = shutil.which("node")
    if node is None or not (REPO / "node_modules" / "aws-kcl").is_dir():
        pytest.skip("not run: node or node_modules/aws-kcl missing (make setup installs it)")
    written = _write(moto_url, stream_name, 2)
    out = tmp_path / "node.handled"
    app = f"app-{stream_name}"
    run = start_worker(
        tmp_path,
        "node",
        processor=f"{node} {NODE_PROCESSOR} {out} node",
        stream=stream_name,
        kinesis=moto_url,
        dynamodb=moto_url,
        processingLanguage="nodejs",
        maxRecords="50",
    )
    last = {shard: records[-1][1] for shard, records in written.items()}
    try:
        wait_until(lambda: _checkpoints(moto_url, app) == last, 60, "both shards checkpointed", run)
    finally:
        assert run.stop() == 0, run.log_tail()
    handled = read_handled([out])
    assert sorted(h.key for h in handled) == sorted(
        k for records in written.values() for k, _ in records
    )
    assert duplicated(handled) == []
    events = read_events([out])
    assert not [e for e in events if e.event == "checkpoint-error"]
    for shard in written:
        names = [e.event for e in events if e.shard == shard]
        assert names[0] == "initialize"
        assert names[-3:] == ["shutdown-requested", "checkpoint", "lease-lost"]


def test_at_a_shards_end_a_v2_processor_is_shut_down_with_terminate_and_checkpoints_shard_end(
    kinesis_local_url: str, moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """kinesis-local ends a split shard as Kinesis does; the parent's processor hears
    shutdown(TERMINATE) (kclpy's v2 name for shardEnded), checkpoints, and the children go on."""
    python = kclpy_or_skip()
    kinesis = make_stream(kinesis_local_url, stream_name, 1)
    before = [(f"{i:05d}", f"{i:05d}|x".encode()) for i in range(20)]
    put_records(kinesis, stream_name, before)
    out = tmp_path / "w1.handled"
    app = f"app-{stream_name}"
    run = start_worker(
        tmp_path,
        "w1",
        processor=f"{python} {BEHAVING} --out {out} --worker w1 --interface v2 --checkpoint-batches",
        stream=stream_name,
        kinesis=kinesis_local_url,
        dynamodb=moto_url,
        shardSyncIntervalMillis="1000",
        parentShardPollIntervalMillis="500",
        # Keep the finished lease: by default it is deleted as soon as the children hold
        # theirs, which can be before this test reads the parent's SHARD_END.
        cleanupLeasesUponShardCompletion="false",
    )
    try:
        wait_until(lambda: len(read_handled([out])) >= 20, 60, "the first records", run)
        parent = kinesis.list_shards(StreamName=stream_name)["Shards"][0]
        low = int(parent["HashKeyRange"]["StartingHashKey"])
        high = int(parent["HashKeyRange"]["EndingHashKey"])
        kinesis.split_shard(
            StreamName=stream_name,
            ShardToSplit=parent["ShardId"],
            NewStartingHashKey=str((low + high + 1) // 2),
        )
        kinesis.get_waiter("stream_exists").wait(
            StreamName=stream_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )
        wait_until(
            lambda: (
                kinesis.describe_stream_summary(StreamName=stream_name)["StreamDescriptionSummary"][
                    "StreamStatus"
                ]
                == "ACTIVE"
            ),
            30,
            "the split done",
        )
        after = [(f"{i:05d}", f"{i:05d}|x".encode()) for i in range(20, 40)]
        put_records(kinesis, stream_name, after)
        keys = {key for key, _ in before + after}
        wait_until(lambda: {h.key for h in read_handled([out])} >= keys, 90, "every record", run)
        wait_until(
            lambda: _checkpoints(moto_url, app).get(parent["ShardId"]) == "SHARD_END",
            30,
            "the parent's SHARD_END",
            run,
        )
    finally:
        assert run.stop() == 0, run.log_tail()
    events = [(e.event, e.detail) for e in read_events([out]) if e.shard == parent["ShardId"]]
    assert events[-2:] == [("shutdown", "TERMINATE"), ("checkpoint", "end")]
    assert duplicated(read_handled([out])) == []
    assert "shard ended; the processor checkpoints its end" in run.log()


def test_kpl_aggregates_reach_a_kclpy_processor_de_aggregated_as_the_kcl_delivers_them(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    from aws_kinesis_agg.aggregator import RecordAggregator

    python = kclpy_or_skip()
    kinesis = make_stream(moto_url, stream_name, 1)
    aggregator = RecordAggregator()
    for i in range(5):
        aggregator.add_user_record(f"k{i}", f"{i:05d}|sub".encode())
    key, _, data = aggregator.clear_and_get().get_contents()
    aggregate = kinesis.put_record(StreamName=stream_name, PartitionKey=key, Data=data)
    put_records(kinesis, stream_name, [("plain", b"00005|plain")])
    out = tmp_path / "w1.handled"
    run = start_worker(
        tmp_path,
        "w1",
        processor=f"{python} {BEHAVING} --out {out} --worker w1 --midbatch",
        stream=stream_name,
        kinesis=moto_url,
        dynamodb=moto_url,
    )
    try:
        wait_until(lambda: len(read_handled([out])) >= 6, 60, "six records", run)
    finally:
        assert run.stop() == 0, run.log_tail()
    handled = read_handled([out])
    subs = [(h.sequence, h.sub, h.key) for h in handled if h.key != "00005"]
    assert subs == [(aggregate["SequenceNumber"], i, f"{i:05d}") for i in range(5)]
    # The mid-batch checkpoint named a sub-record: its sequence and sub-sequence number.
    checkpoints = [e.detail for e in read_events([out]) if e.event == "checkpoint"]
    assert f"{aggregate['SequenceNumber']}/3" in checkpoints


def test_a_processor_that_cannot_be_started_is_refused_at_once_by_name(tmp_path: Path) -> None:
    run = start_worker(
        tmp_path,
        "w1",
        processor="no-such-processor --flag",
        stream="s",
        kinesis="http://127.0.0.1:9",
        dynamodb="http://127.0.0.1:9",
    )
    assert run.wait(60) == 1
    assert "property 'executableName': the record processor 'no-such-processor' is not an" in (
        run.log()
    )
