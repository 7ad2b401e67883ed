from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from shardflow.positions import PositionKind, StartPosition


def test_positions_without_values_ask_only_for_the_iterator_type() -> None:
    assert StartPosition.trim_horizon().iterator_params() == {"ShardIteratorType": "TRIM_HORIZON"}
    assert StartPosition.latest().iterator_params() == {"ShardIteratorType": "LATEST"}


def test_timestamp_position_passes_the_moment() -> None:
    moment = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    params = StartPosition.at_timestamp(moment).iterator_params()
    assert params == {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": moment}


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        (StartPosition.at_sequence_number, "AT_SEQUENCE_NUMBER"),
        (StartPosition.after_sequence_number, "AFTER_SEQUENCE_NUMBER"),
    ],
)
def test_sequence_positions_pass_the_sequence_number(build: object, kind: str) -> None:
    position = build("49590338271490256608559692538361571095921575989136588898")  # type: ignore[operator]
    assert position.iterator_params() == {
        "ShardIteratorType": kind,
        "StartingSequenceNumber": "49590338271490256608559692538361571095921575989136588898",
    }
    assert position.is_sequence_relative


def test_naive_timestamps_are_refused_as_ambiguous() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        StartPosition.at_timestamp(datetime(2024, 5, 1, 12, 0))


@pytest.mark.parametrize("bad", ["", "12ab", "-5", " 7"])
def test_sequence_numbers_must_be_decimal(bad: str) -> None:
    with pytest.raises(ValueError, match="decimal sequence number"):
        StartPosition.after_sequence_number(bad)


def test_values_that_do_not_belong_to_the_kind_are_refused() -> None:
    with pytest.raises(ValueError, match="takes no timestamp"):
        StartPosition(PositionKind.LATEST, timestamp=datetime.now(UTC))
    with pytest.raises(ValueError, match="takes no sequence number"):
        StartPosition(PositionKind.TRIM_HORIZON, sequence_number="1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trim-horizon", StartPosition.trim_horizon()),
        ("TRIM_HORIZON", StartPosition.trim_horizon()),
        (" latest ", StartPosition.latest()),
        ("Latest", StartPosition.latest()),
    ],
)
def test_parse_named_positions(text: str, expected: StartPosition) -> None:
    assert StartPosition.parse(text) == expected


def test_parse_iso_timestamps_with_and_without_offset() -> None:
    with_z = StartPosition.parse("2024-05-01T12:00:00Z")
    with_offset = StartPosition.parse("2024-05-01T14:00:00+02:00")
    without = StartPosition.parse("2024-05-01T12:00:00")
    assert with_z.kind is PositionKind.AT_TIMESTAMP
    assert with_z.timestamp == with_offset.timestamp == without.timestamp
    assert without.timestamp is not None
    assert without.timestamp.utcoffset() == timedelta(0)
    assert with_offset.timestamp is not None
    assert with_offset.timestamp.tzinfo == timezone(timedelta(hours=2))


@pytest.mark.parametrize("bad", ["yesterday", "2024-13-01", "", "trim horizon"])
def test_parse_rejects_other_text_with_a_hint(bad: str) -> None:
    with pytest.raises(ValueError, match="expected trim-horizon, latest or an ISO timestamp"):
        StartPosition.parse(bad)


def test_positions_are_values() -> None:
    moment = datetime(2024, 5, 1, tzinfo=UTC)
    assert StartPosition.at_timestamp(moment) == StartPosition.at_timestamp(moment)
    assert hash(StartPosition.latest()) == hash(StartPosition.latest())
    assert str(StartPosition.after_sequence_number("42")) == "AFTER_SEQUENCE_NUMBER 42"
