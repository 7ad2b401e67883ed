"""The source's options, checked once on the driver and carried to executors in partitions.

Every problem raises :class:`~shardflow.errors.SparkOptionError` naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from shardflow.aws.settings import AwsSettings
from shardflow.errors import SparkOptionError
from shardflow.spark.connection import (
    CONNECTION_OPTIONS,
    StreamConnection,
    lookup,
    stream_connection,
)
from shardflow.spark.option_values import flag, number, reject_unknown, whole_number
from shardflow.spark.source.metadata_location import MetadataLocation, parse_location
from shardflow.spark.source.positions import (
    LATEST,
    ShardPosition,
    parse_per_shard,
    parse_timestamp_ms,
    parse_user_position,
)

SOURCE_OPTIONS = (
    *CONNECTION_OPTIONS,
    "startingPosition",
    "startingTimestamp",
    "endingPosition",
    "consumerType",
    "consumerName",
    "maxRecordsPerTrigger",
    "maxRecordsPerShardPerTrigger",
    "deaggregate",
    "failOnDataLoss",
    "metadataPath",
    "metadataRegion",
    "metadataEndpointUrl",
    "shardSyncIntervalSeconds",
    "shardsPerTask",
)
"""Every option the source reads; any other is refused (a typo would be ignored otherwise)."""


AUTO_TASKS = 4
"""Without ``shardsPerTask``, a batch is cut into about this many tasks (fewer shards: one a
task), each of at most :data:`AUTO_MAX_SHARDS_PER_TASK` shards. A task costs Spark about
100 ms of a Python worker call and of the JVM's side of it, while the shards of one task
overlap their round trips on its event loop: bench/spark_source.py's ``--scale`` sweep at 256
shards on 2 cores (fb7402e, one round) read KPL-aggregated records 1.05x the boto3 loop with
tasks of 64 shards, 0.87x with 32 and 0.66x with 16, and plain records 1.10-1.34x with 32 or
64. A cluster of more cores than 4 wants ``shardsPerTask`` = shards / cores."""

AUTO_MAX_SHARDS_PER_TASK = 64

MAX_SHARDS_PER_TASK = 1024
"""A task reads its shards at once, each with a chunk in flight: more is a typo, not a plan."""


def shards_per_task_for(shards: int, configured: int | None) -> int:
    """Shards one task reads in a batch of ``shards``: ``configured``, or the automatic choice."""
    if configured is not None:
        return configured
    return max(1, min(AUTO_MAX_SHARDS_PER_TASK, -(-shards // AUTO_TASKS)))


class ConsumerType(StrEnum):
    POLLING = "polling"
    EFO = "efo"


@dataclass(frozen=True, slots=True)
class StartingPosition:
    """``startingPosition``: one position for every shard, or a JSON object per shard.

    ``default`` is a :class:`ShardPosition` or ``"LATEST"``; ``per_shard`` overrides it for
    the shards it names (the others take ``default``, which is TRIM_HORIZON for a JSON object).
    """

    default: ShardPosition | str
    per_shard: Mapping[str, ShardPosition | str]

    def for_shard(self, shard_id: str) -> ShardPosition | str:
        return self.per_shard.get(shard_id, self.default)


@dataclass(frozen=True, slots=True)
class EndingPosition:
    """``endingPosition`` of a batch read: the tip (LATEST), a moment, or a sequence number per
    shard (inclusive; shards not named are read to the tip)."""

    timestamp_ms: int | None = None
    per_shard: Mapping[str, str] | None = None

    def sequence_for(self, shard_id: str) -> str | None:
        return None if self.per_shard is None else self.per_shard.get(shard_id)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the source was told, validated."""

    connection: StreamConnection
    starting: StartingPosition
    ending: EndingPosition
    consumer_type: ConsumerType
    consumer_name: str | None
    max_records_per_trigger: int | None
    max_records_per_shard_per_trigger: int | None
    deaggregate: bool
    fail_on_data_loss: bool
    metadata: MetadataLocation | None
    shard_sync_interval_s: float
    shards_per_task: int | None = None
    """``shardsPerTask``; None: :func:`shards_per_task_for` picks."""

    @property
    def stream(self) -> str:
        """How API calls name the stream: its ARN if given, else its name."""
        connection = self.connection
        return connection.stream_arn or connection.stream_name or ""


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate the options of a streaming (``readStream``) or batch (``read``) source."""
    reject_unknown(options, SOURCE_OPTIONS, where="source")
    connection = stream_connection(options)
    consumer_type = _consumer_type(options)
    consumer_name = lookup(options, "consumerName") or None
    if consumer_type is ConsumerType.EFO and not consumer_name:
        raise SparkOptionError("consumerName", "required with consumerType=efo")
    metadata = _metadata(options, connection)
    if streaming and metadata is None:
        raise SparkOptionError(
            "metadataPath",
            "required for streaming: where the source records where each micro-batch ends, "
            "shared by the driver and every executor (s3://bucket/prefix on a cluster, "
            "dynamodb://table, or a shared directory); keep it with the query's checkpoint",
        )
    starting = _starting(options)
    if not streaming and starting.default == LATEST:
        raise SparkOptionError("startingPosition", "LATEST reads nothing in a batch query")
    return SourceOptions(
        connection=connection,
        starting=starting,
        ending=_ending(options, streaming=streaming),
        consumer_type=consumer_type,
        consumer_name=consumer_name,
        max_records_per_trigger=whole_number(options, "maxRecordsPerTrigger"),
        max_records_per_shard_per_trigger=whole_number(options, "maxRecordsPerShardPerTrigger"),
        deaggregate=flag(options, "deaggregate") is not False,
        fail_on_data_loss=flag(options, "failOnDataLoss") is not False,
        metadata=metadata,
        shard_sync_interval_s=number(options, "shardSyncIntervalSeconds") or 10.0,
        shards_per_task=_shards_per_task(options),
    )


def check_options(options: Mapping[str, str]) -> None:
    """Raise :class:`SparkOptionError` for an option that is wrong for reads of either kind.

    What depends on the kind (``metadataPath`` for streaming, ``endingPosition`` for batch,
    ``LATEST`` for streaming) is checked when the query is planned, and for a streaming read
    already at ``.load()`` in the driver (:mod:`shardflow.spark.stream_load`).
    """
    neutral = {k: v for k, v in options.items() if k.lower() != "endingposition"}
    neutral.setdefault("metadataPath", "checked later")
    parse_options(neutral, streaming=True)


def _shards_per_task(options: Mapping[str, str]) -> int | None:
    """``shardsPerTask``: how many shards one Spark task reads, side by side (auto: None)."""
    text = lookup(options, "shardsPerTask")
    if text is not None and text.strip() and text.strip().lower() != "auto":
        try:
            value = int(text.strip())
        except ValueError:
            value = 0
        if value < 1 or value > MAX_SHARDS_PER_TASK:
            raise SparkOptionError(
                "shardsPerTask",
                f"expected auto or a whole number from 1 to {MAX_SHARDS_PER_TASK} (how many "
                f"shards one Spark task reads side by side), got {text!r}",
            )
        return value
    return None


def _metadata(options: Mapping[str, str], connection: StreamConnection) -> MetadataLocation | None:
    """``metadataPath``, reached with ``metadataRegion``/``metadataEndpointUrl`` (S3, DynamoDB),
    which default to the stream's ``region``/``endpointUrl`` (one local stack serves both)."""
    text = lookup(options, "metadataPath")
    if text is None or not text.strip():
        return None
    aws = AwsSettings(
        region=lookup(options, "metadataRegion") or connection.region,
        endpoint_url=lookup(options, "metadataEndpointUrl") or connection.endpoint_url,
    )
    return parse_location(text, aws)


def _consumer_type(options: Mapping[str, str]) -> ConsumerType:
    text = (lookup(options, "consumerType") or "polling").strip().lower()
    try:
        return ConsumerType(text)
    except ValueError:
        raise SparkOptionError("consumerType", f"{text!r} is not polling or efo") from None


def _starting(options: Mapping[str, str]) -> StartingPosition:
    text = (lookup(options, "startingPosition") or "TRIM_HORIZON").strip()
    if text.upper() == "AT_TIMESTAMP":
        timestamp = lookup(options, "startingTimestamp")
        if not timestamp:
            raise SparkOptionError(
                "startingTimestamp", "required with startingPosition=AT_TIMESTAMP"
            )
        try:
            moment = parse_timestamp_ms(timestamp)
        except ValueError as error:
            raise SparkOptionError("startingTimestamp", str(error)) from None
        return StartingPosition(ShardPosition.at_timestamp_ms(moment), {})
    try:
        if text.startswith("{"):
            return StartingPosition(ShardPosition.trim_horizon(), parse_per_shard(text))
        position = parse_user_position(text)
    except ValueError as error:
        raise SparkOptionError("startingPosition", str(error)) from None
    if isinstance(position, ShardPosition) and position.names_record:
        raise SparkOptionError(
            "startingPosition",
            "a sequence number names a record of one shard: give a JSON object of shard id "
            'to position, e.g. {"shardId-000000000000": "AFTER_SEQUENCE_NUMBER:…"}',
        )
    return StartingPosition(position, {})


def _ending(options: Mapping[str, str], *, streaming: bool) -> EndingPosition:
    text = (lookup(options, "endingPosition") or "").strip()
    if not text:
        return EndingPosition()
    if streaming:
        raise SparkOptionError("endingPosition", "only batch reads (spark.read) take an end")
    if text.upper() == LATEST:
        return EndingPosition()
    try:
        if text.startswith("{"):
            per_shard: dict[str, str] = {}
            for shard, position in parse_per_shard(text).items():
                if not isinstance(position, ShardPosition) or position.sequence_number is None:
                    raise ValueError(f"{shard}: an end is a sequence number (inclusive)")
                per_shard[shard] = position.sequence_number
            return EndingPosition(per_shard=per_shard)
        head, sep, rest = text.partition(":")
        moment = rest if sep and head.upper() == "AT_TIMESTAMP" else text
        return EndingPosition(timestamp_ms=parse_timestamp_ms(moment))
    except ValueError as error:
        raise SparkOptionError(
            "endingPosition",
            f"{error} (expected LATEST, an ISO 8601 timestamp, AT_TIMESTAMP:<…> or a JSON "
            "object of shard id to sequence number)",
        ) from None
