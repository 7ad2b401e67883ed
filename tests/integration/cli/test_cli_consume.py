"""``shardflow consume`` as real processes on moto: two workers share a table, SIGTERM ends them.

Each worker runs ``python -m shardflow consume handler:handle`` with a handler module written
for the test that appends every record to that worker's own file.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from shardflow.cli import app
from shardflow.testing.faults import INTERNAL_FAILURE, ErrorResponse, FaultProxy
from support.accounts import ROLE_ARN, other_account_stream
from support.boto import lease_items, make_stream, put_records
from support.streams import last_per_shard

HANDLER = """
import os
import time

OUT = os.environ["SHARDFLOW_TEST_OUT"]


def handle(record):
    with open(OUT, "a", encoding="utf-8") as out:
        out.write(f"{record.shard_id} {record.sequence_number} {record.value}\\n")


def stuck(record):
    with open(OUT, "a", encoding="utf-8") as out:
        out.write("started\\n")
    time.sleep(3600)


async def picky(record):
    if record.value["n"] == 7:
        raise ValueError("seven is refused")
    with open(OUT, "a", encoding="utf-8") as out:
        out.write(f"{record.partition_key} {record.value['n']}\\n")


def timed(record):
    # Logs each call's start and end; with SHARDFLOW_TEST_SLOW a "-slow" record takes 5 s.
    with open(OUT, "a", encoding="utf-8") as out:
        out.write(f"start {record.shard_id} {record.data.decode()} {time.time()}\\n")
    slow = os.environ.get("SHARDFLOW_TEST_SLOW") and record.data.endswith(b"-slow")
    time.sleep(5.0 if slow else 0.01)
    with open(OUT, "a", encoding="utf-8") as out:
        out.write(f"end {record.shard_id} {record.data.decode()} {time.time()}\\n")


async def handle_batch(records):
    with open(OUT, "a", encoding="utf-8") as out:
        for record in records:
            out.write(f"{record.shard_id} {record.sequence_number} {record.value['n']}\\n")
"""

LIMIT = 40.0


def wait_for(condition: Callable[[], bool], within: float = LIMIT, what: str = "") -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.1)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@contextmanager
def worker(
    tmp_path: Path,
    name: str,
    url: str,
    stream: str,
    app_name: str,
    *extra: str,
    target: str = "handler:handle",
    env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    out = tmp_path / f"{name}.out"
    log = (tmp_path / f"{name}.log").open("wb")
    env = {**os.environ, "SHARDFLOW_TEST_OUT": str(out), "PYTHONUNBUFFERED": "1", **(env or {})}
    command = [
        sys.executable,
        "-m",
        "shardflow",
        "consume",
        target,
        "--stream",
        stream,
        "--app",
        app_name,
        "--endpoint-url",
        url,
        "--worker-id",
        name,
        "--failover-time",
        "2",
        "--take-interval",
        "0.5",
        "--idle-time",
        "0.1",
        *extra,
    ]
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        yield process, out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def stop(process: subprocess.Popen[bytes], log: Path) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(20)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no exit after SIGTERM:\n{log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]


def test_two_worker_processes_split_the_shards_and_sigterm_checkpoints_and_releases(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 4)
    # Checkpoints only at shutdown: whatever the table shows afterwards, SIGTERM wrote it.
    quiet = (
        "--checkpoint-every",
        "100000",
        "--checkpoint-interval",
        "1000",
        "--deserializer",
        "utf8",
    )
    with (
        worker(tmp_path, "w1", moto_url, stream_name, app_name, *quiet) as (first, first_out),
        worker(tmp_path, "w2", moto_url, stream_name, app_name, *quiet) as (second, second_out),
    ):

        def balanced() -> bool:
            owners = Counter(
                i.get("leaseOwner", {}).get("S") for i in lease_items(moto_url, app_name).values()
            )
            return owners == Counter({"w1": 2, "w2": 2})

        wait_for(balanced, what="two leases per worker")
        # A worker whose lease was stolen learns it at its next renewal (KCL 2.x stealing, to
        # be replaced by handoffs): let every renewal round pass before writing records.
        time.sleep(1.5)
        assert balanced()
        written = [(f"key-{i % 23}", f"record-{i}".encode()) for i in range(400)]
        placed = [
            (e["ShardId"], e["SequenceNumber"]) for e in put_records(kinesis, stream_name, written)
        ]

        def all_handled() -> bool:
            data = {line.split(" ")[2] for line in lines(first_out) + lines(second_out)}
            return data >= {d.decode() for _, d in written}

        wait_for(all_handled, what="every record handled")
        stop(first, tmp_path / "w1.log")
        stop(second, tmp_path / "w2.log")

    seen = lines(first_out) + lines(second_out)
    assert len(seen) == len(written)  # each record once: the workers never shared a shard
    shards_of = {
        name: {line.split(" ")[0] for line in lines(out)}
        for name, out in (("w1", first_out), ("w2", second_out))
    }
    assert len(shards_of["w1"]) == 2
    assert len(shards_of["w2"]) == 2
    assert not shards_of["w1"] & shards_of["w2"]
    last = last_per_shard(placed)
    table = lease_items(moto_url, app_name)
    assert {key: item["checkpoint"]["S"] for key, item in table.items()} == last
    assert all("leaseOwner" not in item for item in table.values())  # released

    # shardflow leases: everything handled, then lag once new records arrive.
    runner = CliRunner()
    shown = runner.invoke(
        app,
        [
            "leases",
            app_name,
            "--stream",
            stream_name,
            "--endpoint-url",
            moto_url,
            "--format",
            "json",
        ],
    )
    assert shown.exit_code == 0, shown.output
    rows = {row["lease_key"]: row for row in json.loads(shown.stdout)}
    assert {key: row["checkpoint"] for key, row in rows.items()} == last
    assert {row["lag"] for row in rows.values()} == {"caught up"}
    assert {row["owner"] for row in rows.values()} == {None}

    more = put_records(kinesis, stream_name, [("key-1", b"late")])
    late_shard = more[0]["ShardId"]
    shown = runner.invoke(
        app, ["leases", app_name, "--stream", stream_name, "--endpoint-url", moto_url]
    )
    assert shown.exit_code == 0, shown.output
    # Piped, the table is plain columns, one lease a line (the shard id whole in it).
    table_lines = {
        next(word for word in line.split() if word.startswith("shardId-")): line
        for line in shown.stdout.splitlines()
        if "shardId-" in line
    }
    assert set(table_lines) == set(last)
    assert "behind" in table_lines[late_shard]
    assert all("caught up" in line for key, line in table_lines.items() if key != late_shard)


def test_batch_handler_with_json_values(moto_url: str, stream_name: str, tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 2)
    written = [(f"k{i}", f'{{"n": {i}}}'.encode()) for i in range(50)]
    put_records(kinesis, stream_name, written)
    args = ("--deserializer", "json", "--batch")
    with worker(
        tmp_path, "w1", moto_url, stream_name, app_name, *args, target="handler:handle_batch"
    ) as (process, out):
        wait_for(lambda: len(lines(out)) >= len(written), what="every record")
        stop(process, tmp_path / "w1.log")
    assert sorted(int(line.split(" ")[2]) for line in lines(out)) == list(range(50))
    # The final checkpoint at SIGTERM covers everything: a restart would handle nothing again.
    table = lease_items(moto_url, app_name)
    assert all(item["checkpoint"]["S"].isdigit() for item in table.values())


def test_key_ordered_dispatch_with_dead_letters_to_a_file(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 1)
    put_records(kinesis, stream_name, [(f"k{i % 3}", f'{{"n": {i}}}'.encode()) for i in range(12)])
    letters = tmp_path / "letters.jsonl"
    args = (
        *("--deserializer", "json", "--ordering", "key", "--attempts", "2"),
        *("--on-failure", "block-key", "--dead-letters", f"file:{letters}", "--store-completed"),
    )
    with worker(tmp_path, "w1", moto_url, stream_name, app_name, *args, target="handler:picky") as (
        process,
        out,
    ):
        # 7 is key k1: k1's later records 10 follows it into the dead letters.
        wait_for(lambda: len(lines(out)) >= 9 and len(lines(letters)) >= 2, what="all records")
        stop(process, tmp_path / "w1.log")
    handled = [line.split(" ") for line in lines(out)]
    assert sorted(int(n) for _, n in handled) == [i for i in range(12) if i not in (7, 10)]
    for key in ("k0", "k1", "k2"):
        numbers = [int(n) for k, n in handled if k == key]
        assert numbers == sorted(numbers)
    written = [json.loads(line) for line in lines(letters)]
    assert [json.loads(base64.b64decode(w["data"]))["n"] for w in written] == [7, 10]
    assert [w["blocked_key"] for w in written] == ["k1", "k1"]
    assert [w["error"]["type"] for w in written] == ["ValueError", "KeyBlockedError"]
    (item,) = lease_items(moto_url, app_name).values()
    assert item["checkpoint"]["S"].isdigit()


def test_a_record_the_deserializer_rejects_goes_to_the_dead_letters_and_the_shard_goes_on(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    # Issue 22 item 0, as a new user tried it: the flags the parking message recommends work.
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 1)
    put_records(kinesis, stream_name, [("k", b'{"a": 1}'), ("k", b"not json"), ("k", b'{"a": 2}')])
    letters = tmp_path / "dl.jsonl"
    args = (
        *("--deserializer", "json", "--ordering", "shard"),
        *("--on-failure", "skip", "--dead-letters", f"file:{letters}"),
    )
    with worker(tmp_path, "w1", moto_url, stream_name, app_name, *args) as (process, out):
        wait_for(lambda: len(lines(out)) >= 2 and len(lines(letters)) >= 1, what="all records")
        stop(process, tmp_path / "w1.log")
    assert [line.split(" ", 2)[2] for line in lines(out)] == ["{'a': 1}", "{'a': 2}"]
    (letter,) = [json.loads(line) for line in lines(letters)]
    assert base64.b64decode(letter["data"]) == b"not json"
    assert letter["error"]["type"] == "DeserializationError"
    (item,) = lease_items(moto_url, app_name).values()
    assert item["checkpoint"]["S"].isdigit()


def test_start_timeout_bounds_how_long_a_start_through_a_brownout_is_tried(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    # A Kinesis brownout at start-up is waited out for --start-timeout, then the command
    # exits with one line that names the setting, not a traceback (default 300 s).
    (tmp_path / "handler.py").write_text(HANDLER)
    make_stream(moto_url, stream_name, 1)
    with FaultProxy(moto_url, seed=11) as proxy:
        rule = proxy.add(
            ErrorResponse(INTERNAL_FAILURE, status=500), operation="DescribeStreamSummary"
        )
        started = time.monotonic()
        args = ("--start-timeout", "2")
        with worker(tmp_path, "w1", proxy.url, stream_name, f"app-{stream_name}", *args) as (
            process,
            _,
        ):
            code = process.wait(30)
        took = time.monotonic() - started
        assert proxy.injected_count(rule) >= 2
    log = (tmp_path / "w1.log").read_text()
    assert code == 1, log[-3000:]
    assert "start_timeout=2s" in log, log[-3000:]
    assert "Traceback" not in log
    assert 2.0 <= took < 25.0


def test_dispatch_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text("def handle(record):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        base = ["consume", "h:handle", "-s", "s", "-a", "a"]
        result = CliRunner().invoke(app, [*base, "--on-failure", "skip"])
        assert result.exit_code == 2
        assert "needs --dead-letters" in result.output
        result = CliRunner().invoke(app, [*base, "--dead-letters", "bucket:x"])
        assert result.exit_code == 2
        assert "file:PATH or stream:NAME" in result.output
        result = CliRunner().invoke(app, [*base, "--ordering", "key", "--batch"])
        assert result.exit_code == 2
        assert "--batch cannot be combined" in result.output
    finally:
        sys.path.remove(str(tmp_path))


def test_a_handler_that_cannot_be_imported_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["consume", "no_such_module_here:handle", "-s", "s", "-a", "a"]
    )
    assert result.exit_code == 2
    assert "cannot import module" in result.output
    result = CliRunner().invoke(app, ["consume", "json", "-s", "s", "-a", "a"])
    assert result.exit_code == 2
    assert "MODULE:FUNCTION" in result.output


@pytest.mark.parametrize(
    ("source", "complaint"),
    [
        ("def handle(record)\n    pass\n", "SyntaxError: expected ':' (line 1 of "),
        ("import json\n\nraise RuntimeError('no config')\n", "RuntimeError: no config (line 3 of "),
    ],
)
def test_a_handler_module_that_raises_at_import_is_a_one_line_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, complaint: str
) -> None:
    module = f"broken_{tmp_path.name}"  # a name no other test imported
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    wide = {"COLUMNS": "400"}  # the message on one line of the error box
    result = CliRunner().invoke(
        app, ["consume", f"{module}:handle", "-s", "s", "-a", "a"], env=wide
    )
    assert result.exit_code == 2, result.output
    assert f"cannot import module {module!r}: {complaint}{tmp_path / module}.py)" in result.output
    assert "Traceback" not in result.output


def test_sigterm_ends_the_process_even_when_a_handler_hangs(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 1)
    put_records(kinesis, stream_name, [("k", b"x")])
    args = ("--drain-timeout", "0.5")
    with worker(tmp_path, "w1", moto_url, stream_name, app_name, *args, target="handler:stuck") as (
        process,
        out,
    ):
        wait_for(lambda: lines(out) == ["started"], what="the handler to start")
        started = time.monotonic()
        stop(process, tmp_path / "w1.log")
        assert time.monotonic() - started < 10
    (item,) = lease_items(moto_url, app_name).values()
    assert item["checkpoint"]["S"] == "TRIM_HORIZON"  # the hanging record was not handled
    # Not released while its handler still ran: nobody may start the shard before the lease
    # expired (the process is gone by then, the handler with it).
    assert item["leaseOwner"]["S"] == "w1"
    log = (tmp_path / "w1.log").read_text()
    assert "abandoned" in log
    assert "left to expire" in log


def spans_of(out: Path, name: str, gone: float | None) -> list[tuple[str, str, float, float]]:
    """(worker, shard, start, end) of every call ``timed`` logged; a call that never ended
    ended at the latest when its process was gone (``gone``)."""
    spans: list[tuple[str, str, float, float]] = []
    open_calls: dict[tuple[str, str], float] = {}
    for line in lines(out):
        kind, shard, data, at = line.split(" ")
        if kind == "start":
            open_calls[(shard, data)] = float(at)
        else:
            spans.append((name, shard, open_calls.pop((shard, data)), float(at)))
    for (shard, _), start in open_calls.items():
        assert gone is not None, f"a call of {name} never ended"
        spans.append((name, shard, start, gone))
    return spans


def test_a_stopping_worker_whose_handler_thread_runs_on_is_not_overlapped_by_the_next_owner(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """w1 stops (SIGTERM) while its plain handler sleeps 5 s in a thread, with a drain of 1 s:
    it hands its lease to w2 but cannot complete the handoff while the thread runs, leaves the
    lease to expire and exits without the thread. w2 starts the shard only then: no two calls
    of one shard overlap (each call's start and end logged by the handler, across processes)."""
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 2)
    before = [(f"k{i}", f"before-{i}".encode()) for i in range(10)]
    put_records(kinesis, stream_name, before)
    slow = [(f"k{i}", f"x{i}-slow".encode()) for i in range(10)]
    common = ("--deserializer", "bytes", "--checkpoint-every", "1")
    with worker(
        tmp_path,
        "w1",
        moto_url,
        stream_name,
        app_name,
        *common,
        "--drain-timeout",
        "1",
        target="handler:timed",
        env={"SHARDFLOW_TEST_SLOW": "1"},
    ) as (first, first_out):
        wait_for(lambda: sum(x.startswith("end") for x in lines(first_out)) == 10, what="w1")
        with worker(
            tmp_path, "w2", moto_url, stream_name, app_name, *common, target="handler:timed"
        ) as (second, second_out):

            def one_each() -> bool:
                items = lease_items(moto_url, app_name).values()
                owners = Counter(i.get("leaseOwner", {}).get("S") for i in items)
                handing = any("checkpointOwner" in i for i in items)
                return owners == Counter({"w1": 1, "w2": 1}) and not handing

            wait_for(one_each, what="one lease per worker")
            time.sleep(1.0)
            put_records(kinesis, stream_name, slow)
            wait_for(
                lambda: any(x.startswith("start") and "-slow" in x for x in lines(first_out)),
                what="w1 in its slow handler",
            )
            stop(first, tmp_path / "w1.log")
            gone = time.time()

            def all_handled() -> bool:
                ended = [x.split(" ") for x in lines(first_out) + lines(second_out)]
                done = {parts[2] for parts in ended if parts[0] == "end"}
                return done >= {d.decode() for _, d in slow}

            wait_for(all_handled, what="every slow record handled")
            stop(second, tmp_path / "w2.log")

    by_shard: dict[str, list[tuple[str, str, float, float]]] = {}
    for span in spans_of(first_out, "w1", gone) + spans_of(second_out, "w2", None):
        by_shard.setdefault(span[1], []).append(span)
    for shard, spans in by_shard.items():
        spans.sort(key=lambda span: span[2])
        for earlier, later in itertools.pairwise(spans):
            assert later[2] >= earlier[3], (
                f"shard {shard}: {later[0]} started a call {earlier[3] - later[2]:.2f}s "
                f"before a call of {earlier[0]} ended"
            )
    log = (tmp_path / "w1.log").read_text()
    assert "left to expire" in log


def scrape(url: str) -> tuple[str, dict[str, dict[tuple[tuple[str, str], ...], float]]]:
    """The Content-Type and the samples of a real HTTP scrape, by name and labels."""
    with urllib.request.urlopen(url, timeout=10) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return content_type, found


def test_the_metrics_port_serves_prometheus_on_the_metrics_host(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    """Issue 24 item 2: ``--metrics-host`` is the address the port binds (the socket's own,
    as logged), and a plain HTTP client scrapes the running process there."""
    (tmp_path / "handler.py").write_text(HANDLER)
    app_name = f"app-{stream_name}"
    kinesis = make_stream(moto_url, stream_name, 2)
    put_records(kinesis, stream_name, [(f"k{i}", f"r{i}".encode()) for i in range(30)])
    args = ("--deserializer", "utf8", "--metrics-port", "0", "--metrics-host", "127.0.0.1")
    log = tmp_path / "w1.log"
    with worker(tmp_path, "w1", moto_url, stream_name, app_name, *args) as (process, out):
        wait_for(lambda: "metrics on http://" in log.read_text(), what="the metrics server")
        served = re.search(r"metrics on http://(\S+):(\d+)/metrics", log.read_text())
        assert served is not None
        host, port = served.group(1), int(served.group(2))
        assert host == "127.0.0.1"
        assert port > 0
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: len(lines(out)) >= 30, what="every record")
        stream = (("stream", stream_name),)

        def counted() -> bool:
            samples = scrape(url)[1]
            handled = samples.get("shardflow_consumer_records_total", {}).get(stream)
            return handled == 30 and len(samples.get("shardflow_consumer_unacked_records", {})) == 2

        wait_for(counted, what="30 records and 2 shards in a scrape")
        content_type, samples = scrape(url)
        assert content_type.startswith("text/plain")
        assert samples["shardflow_consumer_owned_shards"][stream] == 2
        assert samples["shardflow_consumer_handler_latency_seconds_count"][stream] == 30
        assert samples["shardflow_consumer_bytes_total"][stream] > 0
        shards = {dict(labels)["shard"] for labels in samples["shardflow_consumer_unacked_records"]}
        assert len(shards) == 2
        stop(process, log)


def test_a_metrics_host_that_cannot_be_bound_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "h.py").write_text("def handle(record):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        result = CliRunner().invoke(
            app,
            [
                *("consume", "h:handle", "-s", "s", "-a", "a", "--region", "us-east-1"),
                *("--metrics-port", "0", "--metrics-host", "256.0.0.1"),
            ],
        )
    finally:
        sys.path.remove(str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "cannot serve metrics on 256.0.0.1" in result.output


def test_consumes_another_accounts_stream_by_arn_with_role_arn(
    moto_url: str, stream_name: str, tmp_path: Path
) -> None:
    (tmp_path / "handler.py").write_text(HANDLER)
    other = other_account_stream(moto_url, stream_name, shards=2)
    written = [(f"key-{i % 5}", f"record-{i}") for i in range(40)]
    put_records(other.kinesis, stream_name, [(k, d.encode()) for k, d in written])
    app_name = f"app-{stream_name}"
    role = ("--role-arn", ROLE_ARN, "--role-session-name", "cli-reader", "--deserializer", "utf8")
    with worker(tmp_path, "w1", moto_url, other.arn, app_name, *role) as (process, out):
        wait_for(lambda: len(lines(out)) >= len(written), what="every record handled")
        stop(process, tmp_path / "w1.log")
    assert sorted(line.split(" ")[2] for line in lines(out)) == sorted(d for _, d in written)
    # The lease table is in the consumer's own account (the base credentials).
    assert len(lease_items(moto_url, app_name)) == 2
