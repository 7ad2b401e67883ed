"""Options of the shardflow Spark source: every bad one is a SparkOptionError naming it."""

from __future__ import annotations

import pytest

from shardflow.errors import SparkOptionError, UnknownSparkOptionError
from shardflow.spark.source.options import ConsumerType, parse_options
from shardflow.spark.source.positions import LATEST, ShardPosition

BASE = {"streamName": "orders", "metadataPath": "/tmp/meta"}


def test_defaults() -> None:
    options = parse_options(BASE, streaming=True)
    assert options.starting.default == ShardPosition.trim_horizon()
    assert options.consumer_type is ConsumerType.POLLING
    assert options.deaggregate
    assert options.fail_on_data_loss
    assert options.max_records_per_trigger is None
    assert options.stream == "orders"


def test_keys_are_case_insensitive_as_spark_lower_cases_them() -> None:
    options = parse_options(
        {"streamname": "orders", "metadatapath": "/m", "maxrecordspertrigger": "10"},
        streaming=True,
    )
    assert options.max_records_per_trigger == 10


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        ({"maxRecordsPerTrigger": "lots"}, "maxRecordsPerTrigger"),
        ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
        ({"maxRecordsPerShardPerTrigger": "-3"}, "maxRecordsPerShardPerTrigger"),
        ({"deaggregate": "maybe"}, "deaggregate"),
        ({"failOnDataLoss": "sure"}, "failOnDataLoss"),
        ({"consumerType": "push"}, "consumerType"),
        ({"consumerType": "efo"}, "consumerName"),
        ({"startingPosition": "SOMEWHERE"}, "startingPosition"),
        ({"startingPosition": "AT_TIMESTAMP"}, "startingTimestamp"),
        ({"startingPosition": "AT_TIMESTAMP", "startingTimestamp": "noon"}, "startingTimestamp"),
        (
            {"startingPosition": "49590338271490256608559692538361571095921575989136588898"},
            "startingPosition",
        ),
        ({"startingPosition": '["not", "an object"]'}, "startingPosition"),
        ({"endingPosition": "LATEST"}, "endingPosition"),
        ({"shardSyncIntervalSeconds": "0"}, "shardSyncIntervalSeconds"),
    ],
)
def test_bad_options_name_the_option(extra: dict[str, str], option: str) -> None:
    with pytest.raises(SparkOptionError) as caught:
        parse_options({**BASE, **extra}, streaming=True)
    assert caught.value.option == option
    assert str(caught.value).startswith(f"option {option}:")


def test_streaming_needs_a_metadata_path_and_a_stream() -> None:
    with pytest.raises(SparkOptionError, match="metadataPath"):
        parse_options({"streamName": "orders"}, streaming=True)
    with pytest.raises(SparkOptionError, match="streamName"):
        parse_options({"metadataPath": "/m"}, streaming=True)
    assert parse_options({"streamName": "orders"}, streaming=False).metadata is None


def test_starting_positions() -> None:
    def starting(text: str, **more: str) -> object:
        return parse_options({**BASE, "startingPosition": text, **more}, streaming=True).starting

    assert starting("latest").default == LATEST  # type: ignore[attr-defined]
    at = starting("AT_TIMESTAMP", startingTimestamp="2024-05-01T12:00:00Z")
    assert at.default == ShardPosition.at_timestamp_ms(1714564800000)  # type: ignore[attr-defined]
    per_shard = starting('{"shardId-1": "AFTER_SEQUENCE_NUMBER:42", "shardId-2": "LATEST"}')
    assert per_shard.for_shard("shardId-1") == ShardPosition.after("42")  # type: ignore[attr-defined]
    assert per_shard.for_shard("shardId-2") == LATEST  # type: ignore[attr-defined]
    assert per_shard.for_shard("shardId-3") == ShardPosition.trim_horizon()  # type: ignore[attr-defined]


def test_batch_ranges() -> None:
    with pytest.raises(SparkOptionError, match="startingPosition"):
        parse_options({"streamName": "s", "startingPosition": "LATEST"}, streaming=False)
    ending = parse_options(
        {"streamName": "s", "endingPosition": '{"shardId-1": "77"}'}, streaming=False
    ).ending
    assert ending.sequence_for("shardId-1") == "77"
    assert ending.sequence_for("shardId-2") is None
    moment = parse_options(
        {"streamName": "s", "endingPosition": "AT_TIMESTAMP:1714564800000"}, streaming=False
    ).ending
    assert moment.timestamp_ms == 1714564800000
    with pytest.raises(SparkOptionError, match="endingPosition"):
        parse_options(
            {"streamName": "s", "endingPosition": '{"a": "TRIM_HORIZON"}'}, streaming=False
        )


@pytest.mark.parametrize(
    ("given", "closest"),
    [
        ("startingPostion", "startingPosition"),
        ("startingpostion", "startingPosition"),  # as Spark hands it over, lower-cased
        ("metadatapth", "metadataPath"),
        ("maxRecordsPerTriger", "maxRecordsPerTrigger"),
        ("streamname ", "streamName"),
    ],
)
def test_an_unknown_option_is_refused_naming_the_closest(given: str, closest: str) -> None:
    with pytest.raises(UnknownSparkOptionError) as caught:
        parse_options({**BASE, given: "TRIM_HORIZON"}, streaming=False)
    assert caught.value.option == given
    assert caught.value.closest == closest
    assert str(caught.value).endswith(f"did you mean {closest}?")


def test_an_unknown_option_like_none_lists_the_known_ones() -> None:
    with pytest.raises(UnknownSparkOptionError, match="known options: streamName, ") as caught:
        parse_options({**BASE, "path": "orders"}, streaming=True)  # .load("orders")
    assert caught.value.closest is None
