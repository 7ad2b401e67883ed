"""The protocol's bytes: what the KCL's MultiLangDaemon writes (captured from KCL 2.5.8 and
3.1.3, identical) and how it reads what processors write."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.multilang import messages
from shardflow.multilang.messages import CheckpointRequest, Status, Unexpected, decode
from shardflow.records import ExtendedSequenceNumber, Record

# Lines the real MultiLangDaemon (KCL 2.5.8 and 3.1.3 alike) wrote to a processor's stdin for
# five plain records, a KPL aggregate of three and one binary record (kinesalite, one shard).
SEQ = "4968059021248088387644150801957"
KCL_INITIALIZE = (
    b'{"action":"initialize","shardId":"shardId-000000000000",'
    b'"sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n'
)
KCL_PROCESS_RECORDS = (
    b'{"action":"processRecords","records":['
    b'{"data":"MDAwMDB8aGVsbG8=","partitionKey":"k0","sequenceNumber":"' + SEQ.encode() + b'1",'
    b'"approximateArrivalTimestamp":1795716073220,"subSequenceNumber":0,"action":"record"},'
    b'{"data":"YWdnMA==","partitionKey":"ak0","sequenceNumber":"' + SEQ.encode() + b'2",'
    b'"approximateArrivalTimestamp":1795716073223,"subSequenceNumber":0,"action":"record"},'
    b'{"data":"YWdnMQ==","partitionKey":"ak1","sequenceNumber":"' + SEQ.encode() + b'2",'
    b'"approximateArrivalTimestamp":1795716073223,"subSequenceNumber":1,"action":"record"},'
    b'{"data":"AP8gYmluYXJ5","partitionKey":"z","sequenceNumber":"' + SEQ.encode() + b'3",'
    b'"approximateArrivalTimestamp":1795716073225,"subSequenceNumber":0,"action":"record"}'
    b'],"millisBehindLatest":0}\n'
)
KCL_CHECKPOINT_OK = (
    b'{"action":"checkpoint","sequenceNumber":"' + SEQ.encode() + b'1","subSequenceNumber":null,'
    b'"error":null}\n'
)
KCL_CHECKPOINT_REFUSED = (
    b'{"action":"checkpoint","sequenceNumber":"12345","subSequenceNumber":0,'
    b'"error":"IllegalArgumentException"}\n'
)


def at(millis: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)


def test_initialize_is_the_kcls_line() -> None:
    position = ExtendedSequenceNumber("TRIM_HORIZON", 0)
    assert messages.initialize("shardId-000000000000", position) == KCL_INITIALIZE


def test_process_records_is_the_kcls_line_for_plain_and_deaggregated_records() -> None:
    records = [
        Record(b"00000|hello", "k0", SEQ + "1", 0, approximate_arrival_timestamp=at(1795716073220)),
        Record(b"agg0", "ak0", SEQ + "2", 0, approximate_arrival_timestamp=at(1795716073223)),
        Record(b"agg1", "ak1", SEQ + "2", 1, approximate_arrival_timestamp=at(1795716073223)),
        Record(
            b"\x00\xff binary", "z", SEQ + "3", 0, approximate_arrival_timestamp=at(1795716073225)
        ),
    ]
    assert messages.process_records(records, 0) == KCL_PROCESS_RECORDS


def test_arrival_is_truncated_to_the_millisecond_as_java_does() -> None:
    # GetRecords says 1795716073.221 (seconds, to the millisecond): held as the nearest float
    # (...220999956), its datetime is .221000 and the millisecond stays 221.
    record = Record(
        b"", "k", "1", approximate_arrival_timestamp=datetime.fromtimestamp(1795716073.221, UTC)
    )
    assert messages.arrival_millis(record) == 1795716073221
    late = Record(
        b"", "k", "1", approximate_arrival_timestamp=at(1795716073221) + timedelta(microseconds=999)
    )
    assert messages.arrival_millis(late) == 1795716073221  # truncated, never rounded up
    assert messages.arrival_millis(Record(b"", "k", "1")) is None


def test_checkpoint_answers_echo_the_request_as_the_kcl_does() -> None:
    assert messages.checkpoint_answer(CheckpointRequest(SEQ + "1", None), None) == KCL_CHECKPOINT_OK
    refused = messages.checkpoint_answer(CheckpointRequest("12345", 0), "IllegalArgumentException")
    assert refused == KCL_CHECKPOINT_REFUSED


def test_endings_are_the_kcls_lines() -> None:
    assert messages.LEASE_LOST == b'{"action":"leaseLost"}\n'
    assert messages.SHARD_ENDED == b'{"action":"shardEnded"}\n'
    assert messages.SHUTDOWN_REQUESTED == b'{"action":"shutdownRequested"}\n'


def test_what_processors_write_is_read_as_the_kcl_reads_it() -> None:
    # kclpy writes "\n{...}\n"; blank lines are nothing.
    assert decode(b"\n") is None
    assert decode(b'{"action": "status", "responseFor": "initialize"}\n') == Status("initialize")
    assert decode(b'{"action":"checkpoint","sequenceNumber":"5","subSequenceNumber":2}') == (
        CheckpointRequest("5", 2)
    )
    # aws-kcl for Node.js leaves the sub-sequence number out.
    assert decode(b'{"action":"checkpoint","sequenceNumber":"5"}') == CheckpointRequest("5", None)
    assert decode(b'{"action":"checkpoint","sequenceNumber":null}') == CheckpointRequest(None, None)
    # Jackson coerces scalars into the fields' types.
    assert decode(b'{"action":"checkpoint","sequenceNumber":5,"subSequenceNumber":"3"}') == (
        CheckpointRequest("5", 3)
    )
    assert decode(b'{"action":"status"}') == Status(None)


def test_lines_the_kcl_skips_are_unexpected_with_a_reason() -> None:
    for line, why in [
        (b"plain stdout noise\n", "not JSON"),
        (b"[1, 2]\n", "not a JSON object"),
        (b'{"action":"nonsense"}\n', "no known action"),
        (b'{"no":"action"}\n', "no known action"),
        (b'{"action":"initialize","shardId":"x"}\n', "'initialize' message"),
        (b'{"action":"checkpoint","sequenceNumber":{}}\n', "not text"),
        (b'{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":"x"}\n', "not a number"),
    ]:
        answer = decode(line)
        assert isinstance(answer, Unexpected)
        assert why in answer.why
        assert answer.line == line


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.from_regex(r"[0-9]{1,56}", fullmatch=True)),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**63 - 1)),
)
def test_checkpoint_requests_and_answers_round_trip(sequence: str | None, sub: int | None) -> None:
    request = CheckpointRequest(sequence, sub)
    assert decode(messages.checkpoint_request(sequence, sub)) == request
    answer = orjson.loads(messages.checkpoint_answer(request, "ShutdownException"))
    assert answer == {
        "action": "checkpoint",
        "sequenceNumber": sequence,
        "subSequenceNumber": sub,
        "error": "ShutdownException",
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=64),
            st.text(min_size=1, max_size=256),
            st.from_regex(r"[0-9]{1,56}", fullmatch=True),
            st.integers(min_value=0, max_value=10_000),
            st.one_of(st.none(), st.integers(min_value=0, max_value=2**42)),
        ),
        max_size=20,
    ),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
)
def test_records_reach_a_processor_as_given(
    rows: list[tuple[bytes, str, str, int, int | None]], behind: int | None
) -> None:
    import base64

    records = [
        Record(data, key, seq, sub, approximate_arrival_timestamp=None if ms is None else at(ms))
        for data, key, seq, sub, ms in rows
    ]
    line = messages.process_records(records, behind)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    decoded = orjson.loads(line)
    assert decoded["millisBehindLatest"] == behind
    assert [
        (
            base64.b64decode(r["data"]),
            r["partitionKey"],
            r["sequenceNumber"],
            r["subSequenceNumber"],
            r["approximateArrivalTimestamp"],
            r["action"],
        )
        for r in decoded["records"]
    ] == [(d, k, s, n, ms, "record") for d, k, s, n, ms in rows]


def test_a_batch_in_pieces_is_the_one_line_the_kcl_writes() -> None:
    # More records than one piece holds, and a last piece that is not full: joined, the pieces
    # are byte for byte the message encoded whole (as the KCL's JSON writer gives it).
    count = 2 * messages.RECORDS_PER_PIECE + 7
    records = [
        Record(
            f"{i:05d}|é\x00".encode(),
            f"kéy-{i % 13}",
            SEQ + str(i),
            i % 3,
            approximate_arrival_timestamp=None if i % 5 == 0 else at(1795716073220 + i),
        )
        for i in range(count)
    ]
    pieces = list(messages.process_records_pieces(records, 1234))
    whole = (
        orjson.dumps(
            {
                "action": "processRecords",
                "records": [
                    {
                        "data": base64.b64encode(r.data).decode(),
                        "partitionKey": r.partition_key,
                        "sequenceNumber": r.sequence_number,
                        "approximateArrivalTimestamp": messages.arrival_millis(r),
                        "subSequenceNumber": r.sub_sequence_number,
                        "action": "record",
                    }
                    for r in records
                ],
                "millisBehindLatest": 1234,
            }
        )
        + b"\n"
    )
    assert b"".join(pieces) == whole
    assert len(pieces) == 5  # head, three pieces of records, tail
    assert max(len(piece) for piece in pieces) < len(whole) // 2
    assert b"".join(messages.process_records_pieces([], None)) == (
        b'{"action":"processRecords","records":[],"millisBehindLatest":null}\n'
    )
