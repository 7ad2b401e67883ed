"""Malformed aggregates: each reason under both policies, fuzzing, and no payload in logs.

Protobuf bodies are written by hand here (tag bytes, varints) so the tests do not depend on
the encoder under test.
"""

from __future__ import annotations

import base64
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardflow.aggregation import MAGIC, aggregate, deaggregate
from shardflow.aggregation._messages import new_aggregated_record
from shardflow.errors import AggregationError
from shardflow.records import Record
from support.aggregate_fuzz import field, framed, varint_field

SECRET = b"card=4111111111111111"
SHARD = "shardId-000000000007"
SEQUENCE = "49590338271490256608559692540925702759324208523137515618"


def outer(data: bytes) -> Record:
    return Record(
        data=data, partition_key="pk", sequence_number=SEQUENCE, shard_id=SHARD, stream_name="s"
    )


USER_RECORD = varint_field(1, 0) + field(3, SECRET)
VALID_BODY = field(1, b"pk") + field(3, USER_RECORD)

MALFORMED = {
    "truncated: magic only": ("truncated", MAGIC),
    "truncated: digest cut short": ("truncated", MAGIC + b"\x00" * 15),
    "md5: digest flipped": ("md5", framed(VALID_BODY)[:-1] + b"\x00"),
    "md5: body changed": ("md5", MAGIC + VALID_BODY[:-1] + b"X" + framed(VALID_BODY)[-16:]),
    "md5: tail chopped": ("md5", framed(VALID_BODY)[:-3]),
    "protobuf: garbage": ("protobuf", framed(b"\xff\xff\xff" + SECRET)),
    "protobuf: length past the end": ("protobuf", framed(b"\x0a\x7f" + SECRET)),
    "protobuf: required data missing": (
        "protobuf",
        framed(field(1, b"pk") + field(3, varint_field(1, 0))),
    ),
    "protobuf: required index missing": (
        "protobuf",
        framed(field(1, b"pk") + field(3, field(3, SECRET))),
    ),
    "protobuf: no user records": ("protobuf", framed(field(1, b"pk"))),
    "protobuf: empty body": ("protobuf", framed(b"")),
    "protobuf: key not UTF-8": ("protobuf", framed(field(1, b"\xff\xfe") + field(3, USER_RECORD))),
    "protobuf: tag key missing": (
        "protobuf",
        framed(field(1, b"pk") + field(3, USER_RECORD + field(4, field(2, b"v")))),
    ),
    "index: partition key": (
        "index",
        framed(field(1, b"pk") + field(3, varint_field(1, 1) + field(3, SECRET))),
    ),
    "index: huge partition key": (
        "index",
        framed(field(1, b"pk") + field(3, varint_field(1, 2**64 - 1) + field(3, SECRET))),
    ),
    "index: explicit hash key": (
        "index",
        framed(VALID_BODY + field(3, varint_field(1, 0) + varint_field(2, 0) + field(3, SECRET))),
    ),
}


def test_the_hand_written_valid_body_decodes() -> None:
    (user_record,) = deaggregate(outer(framed(VALID_BODY)), on_malformed="raise")
    assert (user_record.partition_key, user_record.data) == ("pk", SECRET)


@pytest.mark.parametrize(("reason", "data"), MALFORMED.values(), ids=MALFORMED.keys())
def test_raise_policy_raises_aggregation_error_with_reason_and_position(
    reason: str, data: bytes
) -> None:
    with pytest.raises(AggregationError) as raised:
        deaggregate(outer(data), on_malformed="raise")
    error = raised.value
    assert error.reason == reason
    assert (error.shard_id, error.sequence_number) == (SHARD, SEQUENCE)
    assert SECRET.decode() not in str(error)


@pytest.mark.parametrize(("reason", "data"), MALFORMED.values(), ids=MALFORMED.keys())
def test_plain_policy_delivers_the_record_unchanged_and_warns_without_payload(
    reason: str, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    record = outer(data)
    with caplog.at_level(logging.DEBUG, logger="shardflow.aggregation"):
        delivered = deaggregate(record)

    assert delivered == [record]
    assert delivered[0] is record
    (log,) = [r for r in caplog.records if r.name == "shardflow.aggregation"]
    assert log.levelno == logging.WARNING
    text = log.getMessage()
    for expected in (reason, SHARD, SEQUENCE):
        assert expected in text
    for leaked in (SECRET.decode(), base64.b64encode(data).decode(), data.hex()):
        assert leaked not in text


def test_a_short_record_without_the_magic_is_plain_not_truncated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = outer(MAGIC[:3])
    with caplog.at_level(logging.DEBUG, logger="shardflow.aggregation"):
        assert deaggregate(record, on_malformed="raise") == [record]
    assert not caplog.records


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_malformed"):
        deaggregate(outer(b"x"), on_malformed="drop")  # type: ignore[arg-type]


def assert_only_typed_outcomes(data: bytes) -> None:
    """Both policies: a list of records, or (raise only) an AggregationError; nothing else."""
    record = outer(data)
    delivered = deaggregate(record)
    assert delivered == [record] or (delivered and all(r.aggregated for r in delivered))
    outcome: list[Record] | AggregationError
    try:
        outcome = deaggregate(record, on_malformed="raise")
    except AggregationError as error:
        outcome = error
    if isinstance(outcome, AggregationError):
        assert outcome.reason in {"md5", "truncated", "protobuf", "index", "key"}
        assert delivered == [record]
    else:
        assert outcome == delivered


quiet = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@quiet
@given(tail=st.binary(max_size=400))
def test_arbitrary_bytes_after_the_magic(tail: bytes) -> None:
    assert_only_typed_outcomes(MAGIC + tail)


@quiet
@given(body=st.binary(max_size=400))
def test_arbitrary_bodies_with_a_correct_digest(body: bytes) -> None:
    # A matching MD5 gets random bytes past the digest check and into the protobuf parser.
    assert_only_typed_outcomes(framed(body))


items_strategy = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=8),
        st.binary(max_size=40),
        st.one_of(st.none(), st.integers(0, 2**128 - 1).map(str)),
    ),
    min_size=1,
    max_size=8,
)


@quiet
@given(items=items_strategy, data=st.data(), fix_digest=st.booleans())
def test_mutated_valid_aggregates(
    items: list[tuple[str, bytes, str | None]], data: st.DataObject, fix_digest: bool
) -> None:
    (built,) = aggregate(items)
    body = bytearray(built.data[len(MAGIC) : -16])
    mutation = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
    at = data.draw(st.integers(0, len(body)))
    if mutation == "flip" and at < len(body):
        body[at] ^= data.draw(st.integers(1, 255))
    elif mutation == "truncate":
        del body[at:]
    elif mutation == "insert":
        body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    elif at < len(body):
        del body[at]
    mutated = framed(bytes(body)) if fix_digest else MAGIC + bytes(body) + built.data[-16:]
    assert_only_typed_outcomes(mutated)
    if not fix_digest and bytes(body) != built.data[len(MAGIC) : -16]:
        with pytest.raises(AggregationError, match=r"\(md5\)"):
            deaggregate(outer(mutated), on_malformed="raise")


@quiet
@given(
    partition_key_count=st.integers(0, 3),
    explicit_hash_key_count=st.integers(0, 3),
    indices=st.lists(
        st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 4), st.none() | st.integers(0, 4)),
        min_size=1,
        max_size=6,
    ),
)
def test_table_indices_out_of_range_are_index_errors(
    partition_key_count: int,
    explicit_hash_key_count: int,
    indices: list[tuple[int, int | None]],
) -> None:
    message = new_aggregated_record()
    message.partition_key_table.extend(f"pk{n}" for n in range(partition_key_count))
    message.explicit_hash_key_table.extend(str(n) for n in range(explicit_hash_key_count))
    for partition_key_index, explicit_hash_key_index in indices:
        message.records.add(
            partition_key_index=partition_key_index,
            explicit_hash_key_index=explicit_hash_key_index,
            data=b"d",
        )
    in_range = all(
        p < partition_key_count and (e is None or e < explicit_hash_key_count) for p, e in indices
    )
    record = outer(framed(message.SerializeToString()))

    if in_range:
        user_records = deaggregate(record, on_malformed="raise")
        assert [r.partition_key for r in user_records] == [f"pk{p}" for p, _ in indices]
        assert [r.explicit_hash_key for r in user_records] == [
            None if e is None else str(e) for _, e in indices
        ]
    else:
        with pytest.raises(AggregationError) as raised:
            deaggregate(record, on_malformed="raise")
        assert raised.value.reason == "index"
        assert deaggregate(record) == [record]
