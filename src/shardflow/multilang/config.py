"""A MultiLangDaemon properties file as shardflow runs it: every key honoured, or named.

:func:`load_config` reads the file the ``java ... MultiLangDaemon --properties-file`` command
reads and returns a :class:`MultiLangConfig`: the record processor's command line (split on
spaces, as the KCL splits it), the stream and application, where to connect, and the
consumer's settings with the KCL's defaults. Keys are matched as the KCL matches them
(case-sensitive, except the ``AwsCredentialsProvider`` family); values are converted as it
converts them (numbers, ``true``/``yes``/``on``/``1`` and their opposites, upper-cased
enums). A key the KCL knows but shardflow does not act on, and a key the KCL does not know
(which it ignores silently), is kept in :attr:`MultiLangConfig.notes` with the reason, for the
command to report by name; a value shardflow cannot honour (credentials from an assumed role,
say) raises :class:`~shardflow.multilang.errors.PropertiesError`, as does what the KCL refuses.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from shardflow.aws.settings import AwsSettings
from shardflow.consumer import CheckpointSettings, ConsumerSettings
from shardflow.fetch import FanOut, Polling
from shardflow.leases.settings import LeaseSettings
from shardflow.metrics.cloudwatch import KCL_DIMENSIONS, CloudWatch
from shardflow.multilang.errors import PropertiesError
from shardflow.multilang.properties import Property, read_properties
from shardflow.positions import StartPosition

NoteKind = Literal["no effect", "differs", "unknown"]
"""How a key is not honoured as the KCL honours it: shardflow has no such knob (``no
effect``), does the thing otherwise (``differs``), or the KCL does not know the key either
(``unknown``: it ignores it silently)."""

RetrievalMode = Literal["POLLING", "FANOUT"]

KCL_FAILOVER_MS: Final = 10_000
KCL_MAX_RECORDS: Final = 10_000
KCL_IDLE_TIME_MS: Final = 1_500
DEFAULT_SHUTDOWN_GRACE: Final = 30.0
"""Seconds a stop gives processors to checkpoint when ``shutdownGraceMillis`` is absent or 0
(the KCL's 0 means no graceful shutdown at all: its processors are not asked to checkpoint)."""
DEFAULT_RESPONSE_TIMEOUT: Final = 300.0
"""Seconds a processor may take to answer when ``timeoutInSeconds`` is absent (the KCL then
waits forever; a processor that never answers would hold its shard for good)."""

_COMMAND_SPLIT: Final = re.compile(r" +")
_TRUE: Final = frozenset({"true", "yes", "y", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "n", "off", "0"})
_DEFAULT_CHAINS: Final = frozenset(
    {
        "DefaultCredentialsProvider",
        "DefaultAWSCredentialsProviderChain",
        "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
        "com.amazonaws.auth.DefaultAWSCredentialsProviderChain",
    }
)
_ENVIRONMENT_PROVIDERS: Final = frozenset(
    {
        "EnvironmentVariableCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
        "com.amazonaws.auth.EnvironmentVariableCredentialsProvider",
    }
)
_PROFILE_PROVIDERS: Final = frozenset(
    {
        "ProfileCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.ProfileCredentialsProvider",
        "com.amazonaws.auth.profile.ProfileCredentialsProvider",
    }
)

_POLLING_SET: Final = ("retryGetRecordsInSeconds", "maxGetRecordsThreadPool")
_POLLING_NONZERO: Final = (
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "millisBehindLatestThresholdForReducedTps",
)
"""Set (these to other than 0), any of them makes the KCL's default retrieval mode polling."""

SUPPORTED_KEYS: Final = frozenset(
    {
        "metricsBufferTimeMillis",
        "metricsMaxQueueSize",
        "metricsEnabledDimensions",
        "executableName",
        "streamName",
        "streamArn",
        "applicationName",
        "tableName",
        "workerId",
        "regionName",
        "kinesisEndpoint",
        "dynamoDBEndpoint",
        "AwsCredentialsProvider",
        "AwsCredentialsProviderDynamoDB",
        "initialPositionInStream",
        "initialPositionInStreamExtended",
        "failoverTimeMillis",
        "maxRecords",
        "idleTimeBetweenReadsInMillis",
        "retrievalMode",
        "fanoutConfig.consumerName",
        "shutdownGraceMillis",
        "timeoutInSeconds",
        "callProcessRecordsEvenForEmptyRecordList",
        "maxLeasesForWorker",
        "maxLeasesToStealAtOneTime",
        "shardSyncIntervalMillis",
        "parentShardPollIntervalMillis",
        "cleanupLeasesUponShardCompletion",
        "maxLeaseRenewalThreads",
        "leaseAssignmentIntervalMillis",
        "isGracefulLeaseHandoffEnabled",
        "gracefulLeaseHandoffTimeoutMillis",
        "processingLanguage",
    }
)
"""The keys shardflow honours as the KCL does (``processingLanguage`` only names the
processor's language in the KCL's user agent)."""


@dataclass(frozen=True, slots=True)
class PropertyNote:
    """A key of the file that shardflow does not honour as the KCL does, and why."""

    key: str
    line: int
    kind: NoteKind
    why: str

    def __str__(self) -> str:
        return f"{self.key} (line {self.line}): {self.kind}: {self.why}"


@dataclass(frozen=True, slots=True)
class MultiLangConfig:
    """What a properties file asks for, in shardflow's terms (see :func:`load_config`)."""

    command: tuple[str, ...]
    """The record processor: ``executableName`` split on spaces (no quoting, as the KCL)."""
    stream: str
    """``streamName``, or the name in ``streamArn`` (which wins, as in the KCL)."""
    application: str
    table_name: str
    """The lease table: ``tableName``, default the application name."""
    worker_id: str | None = None
    region: str | None = None
    kinesis_endpoint: str | None = None
    dynamodb_endpoint: str | None = None
    profile: str | None = None
    """A profile named by ``ProfileCredentialsProvider|name``; None: the standard chain."""
    initial_position: StartPosition = field(default_factory=StartPosition.latest)
    retrieval: RetrievalMode = "FANOUT"
    max_records: int = KCL_MAX_RECORDS
    idle_time: float = KCL_IDLE_TIME_MS / 1000
    consumer_name: str | None = None
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    response_timeout: float | None = DEFAULT_RESPONSE_TIMEOUT
    empty_batches: bool = False
    """``callProcessRecordsEvenForEmptyRecordList``: a processRecords with no records after
    every ``idle_time`` without any."""
    metrics: CloudWatch | None = None
    """CloudWatch metrics under the KCL's names, when ``metricsLevel`` asks for them
    (``metricsBufferTimeMillis``, ``metricsMaxQueueSize``, ``metricsEnabledDimensions`` too)."""
    notes: tuple[PropertyNote, ...] = ()

    def consumer_settings(self) -> ConsumerSettings:
        """The consumer under the processors: checkpoints only when a processor asks."""
        fetch: Polling | FanOut
        if self.retrieval == "POLLING":
            fetch = Polling(max_records=self.max_records, idle_time=self.idle_time)
        else:
            fetch = FanOut(consumer_name=self.consumer_name)
        return ConsumerSettings(
            worker_id=self.worker_id,
            initial_position=self.initial_position,
            fetch=fetch,
            leases=self.leases,
            checkpoint=CheckpointSettings(),
            prefetch_records=max(2 * self.max_records, 1_000),
            drain_timeout=self.shutdown_grace,
            metrics=self.metrics,
        )

    def kinesis_aws(self) -> AwsSettings:
        return AwsSettings(
            region=self.region, profile=self.profile, endpoint_url=self.kinesis_endpoint
        )

    def dynamodb_aws(self) -> AwsSettings:
        return AwsSettings(
            region=self.region, profile=self.profile, endpoint_url=self.dynamodb_endpoint
        )


def load_config(path: Path | str) -> MultiLangConfig:
    """The :class:`MultiLangConfig` of the properties file at ``path``."""
    return config_from(read_properties(path))


def config_from(properties: list[Property]) -> MultiLangConfig:
    """The :class:`MultiLangConfig` of parsed properties (see the module doc)."""
    reader = _Reader()
    for prop in properties:
        reader.read(prop)
    return reader.finish()


def kcl_key(key: str) -> str:
    """The name the KCL sets for ``key``: the ``AwsCredentialsProvider`` prefix in any case
    (KCL 3.x; 2.x spelt it ``AWSCredentialsProvider``), everything else as written."""
    if key.lower().startswith("awscredentialsprovider"):
        return "AwsCredentialsProvider" + key[len("awscredentialsprovider") :]
    return key


_NO_EFFECT: Final[dict[str, str]] = {
    "maxActiveThreads": "each processor is a child process driven by one event loop; no thread pool",
    "validateSequenceNumberBeforeCheckpointing": "checkpoints are checked against the records "
    "delivered to the processor, without a call to Kinesis",
    "taskBackoffTimeMillis": "shardflow's retries back off with jitter on their own",
    "logWarningForTaskAfterMillis": "a processor that does not answer is bounded by "
    "timeoutInSeconds (default 300 s) and restarted",
    "listShardsBackoffTimeInMillis": "shardflow's retries back off with jitter on their own",
    "maxListShardsRetryAttempts": "ListShards is retried while the failure may pass",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "shards are listed at start only for "
    "a new application",
    "schedulerInitializationBackoffTimeMillis": "shardflow's retries back off with jitter on their own",
    "shardPrioritization": "shards start in lineage order (parents first) as leases are taken",
    "ignoreUnexpectedChildShards": "child shards come from the parent's shard end",
    "initialLeaseTableReadCapacity": "a new lease table is created on demand (PAY_PER_REQUEST)",
    "initialLeaseTableWriteCapacity": "a new lease table is created on demand (PAY_PER_REQUEST)",
    "leaseTableDeletionProtectionEnabled": "set it on the table itself",
    "leaseTablePitrEnabled": "set it on the table itself",
    "enablePriorityLeaseAssignment": "shardflow takes expired leases first",
    "leaseTableScanTotalSegments": "the lease table is scanned in one segment",
    "retryGetRecordsInSeconds": "GetRecords is retried with backoff while the failure may pass",
    "maxGetRecordsThreadPool": "GetRecords calls run on the event loop",
    "millisBehindLatestThresholdForReducedTps": "a caught-up shard is polled every "
    "idleTimeBetweenReadsInMillis",
    "clientVersionConfig": "shardflow reads and writes the KCL 2.x/3.x lease table as is",
    "migrateAllEntitiesToLeaseTable": "shardflow keeps no worker-metrics or coordinator-state table",
    "tableMigrationCompleteBakeTimeSeconds": "shardflow keeps no worker-metrics or coordinator-state table",
    "fanoutConfig.maxDescribeStreamSummaryRetries": "retried while the failure may pass",
    "fanoutConfig.maxDescribeStreamConsumerRetries": "retried while the failure may pass",
    "fanoutConfig.registerStreamConsumerRetries": "retried while the failure may pass",
    "fanoutConfig.retryBackoffMillis": "shardflow's retries back off with jitter on their own",
}
_KCL3_BALANCING: Final = [
    "coordinatorStateTableName",
    "coordinatorStateBillingMode",
    "coordinatorStateReadCapacity",
    "coordinatorStateWriteCapacity",
    "coordinatorStatePointInTimeRecoveryEnabled",
    "coordinatorStateDeletionProtectionEnabled",
    "coordinatorStateTags",
    "workerMetricsTableName",
    "workerMetricsBillingMode",
    "workerMetricsReadCapacity",
    "workerMetricsWriteCapacity",
    "workerMetricsPointInTimeRecoveryEnabled",
    "workerMetricsDeletionProtectionEnabled",
    "workerMetricsTags",
    "inMemoryWorkerMetricsCaptureFrequencyMillis",
    "workerMetricsReporterFreqInMillis",
    "noOfPersistedMetricsPerWorkerMetrics",
    "disableWorkerMetrics",
    "maxThroughputPerHostKBps",
    "dampeningPercentage",
    "reBalanceThresholdPercentage",
    "allowThroughputOvershoot",
    "varianceBalancingFrequency",
    "workerMetricsEMAAlpha",
    "staleWorkerMetricsEntryCleanupDuration",
]
for _key in _KCL3_BALANCING:
    _NO_EFFECT[_key] = (
        "shardflow balances leases by count among live workers (no leader, no worker-metrics "
        "or coordinator-state table)"
    )


class _Reader:
    """Turns properties into a :class:`MultiLangConfig`, one key at a time."""

    def __init__(self) -> None:
        self.values: dict[str, Property] = {}
        self.notes: list[PropertyNote] = []
        self._noted: dict[str, Callable[[Property], None]] = {
            "AwsCredentialsProviderCloudWatch": self._cloudwatch_credentials,
            "metricsLevel": self._metrics_level,
            "fanoutConfig.consumerArn": self._consumer_arn,
        }

    def read(self, prop: Property) -> None:
        key = kcl_key(prop.key)
        prop = Property(key, prop.value, prop.line)
        self.values[key] = prop
        noted = self._noted.get(key)
        if key in SUPPORTED_KEYS:
            return
        if noted is not None:
            noted(prop)
        elif key in _NO_EFFECT:
            self.note(prop, "no effect", _NO_EFFECT[key])
        else:
            self.note(
                prop,
                "unknown",
                "not a MultiLangDaemon property (the KCL ignores it silently); check its spelling",
            )

    def note(self, prop: Property, kind: NoteKind, why: str) -> None:
        self.notes.append(PropertyNote(prop.key, prop.line, kind, why))

    # --- keys noted as they are read ------------------------------------------------------------

    def _cloudwatch_credentials(self, prop: Property) -> None:
        self.note(prop, "differs", "CloudWatch is reached with the credentials of Kinesis")

    def _metrics_level(self, prop: Property) -> None:
        if prop.value.strip().upper() not in ("NONE", "SUMMARY", "DETAILED"):
            raise PropertiesError(
                f"{prop.value!r} is not a metrics level (NONE, SUMMARY, DETAILED)",
                key=prop.key,
                line=prop.line,
            )

    def _metrics(self) -> CloudWatch | None:
        """CloudWatch as the ``metrics*`` keys ask. The KCL publishes DETAILED metrics when
        ``metricsLevel`` is not set; shardflow publishes only when it is (an unset key sends
        nothing anywhere, which a local run wants), and says so in the migration guide."""
        level = (self.text("metricsLevel") or "").strip().upper()
        for key in ("metricsBufferTimeMillis", "metricsMaxQueueSize", "metricsEnabledDimensions"):
            if key in self.values and level in ("", "NONE"):
                self.note(self.values[key], "no effect", "metricsLevel is not SUMMARY or DETAILED")
        if level in ("", "NONE"):
            return None
        settings: dict[str, Any] = {"level": level}
        interval = self.number("metricsBufferTimeMillis", minimum=1)
        if interval is not None:
            settings["interval"] = interval / 1000
        queue = self.number("metricsMaxQueueSize", minimum=1)
        if queue is not None:
            settings["max_datums"] = queue
        dimensions = self.text("metricsEnabledDimensions")
        if dimensions is not None and dimensions.strip().upper() != "ALL":
            wanted = {d.strip() for d in re.split(r"[,|]", dimensions) if d.strip()}
            unknown = wanted - KCL_DIMENSIONS
            if unknown:
                prop = self.values["metricsEnabledDimensions"]
                raise PropertiesError(
                    f"unknown dimensions {sorted(unknown)} (known: {sorted(KCL_DIMENSIONS)})",
                    key=prop.key,
                    line=prop.line,
                )
            settings["dimensions"] = frozenset(wanted)
        return CloudWatch(**settings)

    def _consumer_arn(self, prop: Property) -> None:
        self.note(
            prop,
            "differs",
            "the stream consumer is found or registered by name "
            "(fanoutConfig.consumerName, default the application name)",
        )

    # --- the result -----------------------------------------------------------------------------

    def text(self, key: str) -> str | None:
        prop = self.values.get(key)
        if prop is None:
            return None
        return prop.value

    def required(self, key: str, what: str) -> str:
        value = self.text(key)
        if value is None or not value.strip():
            raise PropertiesError(f"{what} is required", key=key)
        return value

    def number(self, key: str, *, minimum: int = 0) -> int | None:
        prop = self.values.get(key)
        if prop is None:
            return None
        try:
            value = int(prop.value.strip())
        except ValueError:
            raise PropertiesError(
                f"{prop.value!r} is not a whole number", key=key, line=prop.line
            ) from None
        if value < minimum:
            raise PropertiesError(f"must be at least {minimum}", key=key, line=prop.line)
        return value

    def flag(self, key: str) -> bool | None:
        prop = self.values.get(key)
        if prop is None:
            return None
        word = prop.value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise PropertiesError(f"{prop.value!r} is not true or false", key=key, line=prop.line)

    def finish(self) -> MultiLangConfig:
        executable = self.required("executableName", "the record processor's command line")
        command = tuple(part for part in _COMMAND_SPLIT.split(executable) if part)
        application = self.required("applicationName", "the application name")
        profile = self._credentials("AwsCredentialsProvider")
        lease_profile = self._credentials("AwsCredentialsProviderDynamoDB")
        if lease_profile is not None and lease_profile != profile:
            prop = self.values["AwsCredentialsProviderDynamoDB"]
            raise PropertiesError(
                "other credentials for DynamoDB than for Kinesis are not supported",
                key=prop.key,
                line=prop.line,
            )
        leases = self._leases()
        empty = self.flag("callProcessRecordsEvenForEmptyRecordList")
        return MultiLangConfig(
            command=command,
            stream=self._stream(),
            application=application,
            table_name=(self.text("tableName") or "").strip() or application,
            worker_id=(self.text("workerId") or "").strip() or None,
            region=(self.text("regionName") or "").strip() or None,
            kinesis_endpoint=_endpoint(self.text("kinesisEndpoint")),
            dynamodb_endpoint=_endpoint(self.text("dynamoDBEndpoint")),
            profile=profile,
            initial_position=self._initial_position(),
            retrieval=self._retrieval(),
            max_records=self.number("maxRecords", minimum=1) or KCL_MAX_RECORDS,
            idle_time=(self.number("idleTimeBetweenReadsInMillis") or KCL_IDLE_TIME_MS) / 1000,
            consumer_name=(self.text("fanoutConfig.consumerName") or "").strip() or None,
            leases=leases,
            shutdown_grace=(self.number("shutdownGraceMillis") or 0) / 1000
            or DEFAULT_SHUTDOWN_GRACE,
            response_timeout=self._response_timeout(),
            empty_batches=bool(empty),
            metrics=self._metrics(),
            notes=tuple(self.notes),
        )

    def _stream(self) -> str:
        arn = (self.text("streamArn") or "").strip()
        if arn:
            # arn:aws:kinesis:region:account:stream/name: the KCL keeps only the name.
            parts = arn.split(":", 5)
            resource = parts[5] if len(parts) == 6 else ""
            kind, _, name = resource.partition("/")
            if parts[0] != "arn" or parts[2] != "kinesis" or kind != "stream" or not name:
                prop = self.values["streamArn"]
                raise PropertiesError(
                    f"{arn!r} is not a Kinesis stream ARN", key=prop.key, line=prop.line
                )
            return name
        return self.required("streamName", "a stream name (streamName or streamArn)").strip()

    def _credentials(self, key: str) -> str | None:
        """The profile named by the credentials property ``key`` (None: the standard chain)."""
        prop = self.values.get(key)
        if prop is None:
            return None
        providers = [p.strip() for p in prop.value.split(",") if p.strip()]
        profile: str | None = None
        for provider in providers:
            name, *args = provider.split("|")
            if name in _DEFAULT_CHAINS:
                continue
            if name in _ENVIRONMENT_PROVIDERS:
                # The standard chain reads the environment first.
                continue
            if name in _PROFILE_PROVIDERS and len(args) <= 1:
                profile = args[0] if args else None
                continue
            raise PropertiesError(
                f"credentials provider {name!r} is not supported: shardflow reads credentials "
                "the standard AWS way (environment, profiles with role_arn or SSO, container "
                "and instance roles); name a profile with ProfileCredentialsProvider|NAME",
                key=prop.key,
                line=prop.line,
            )
        return profile

    def _initial_position(self) -> StartPosition:
        prop = self.values.get("initialPositionInStream")
        extended = self.number("initialPositionInStreamExtended")
        name = prop.value.strip().upper() if prop is not None else None
        if extended is not None:
            if name not in (None, "AT_TIMESTAMP"):
                assert prop is not None
                raise PropertiesError(
                    f"{name} conflicts with initialPositionInStreamExtended (an AT_TIMESTAMP "
                    "start); keep one of them",
                    key=prop.key,
                    line=prop.line,
                )
            return StartPosition.at_timestamp(datetime.fromtimestamp(extended, UTC))
        if name is None or name == "LATEST":
            return StartPosition.latest()
        if name == "TRIM_HORIZON":
            return StartPosition.trim_horizon()
        assert prop is not None
        if name == "AT_TIMESTAMP":
            raise PropertiesError(
                "AT_TIMESTAMP needs initialPositionInStreamExtended (epoch seconds)",
                key=prop.key,
                line=prop.line,
            )
        raise PropertiesError(
            f"{prop.value!r} is not TRIM_HORIZON, LATEST or AT_TIMESTAMP",
            key=prop.key,
            line=prop.line,
        )

    def _retrieval(self) -> RetrievalMode:
        prop = self.values.get("retrievalMode")
        mode = prop.value.strip().upper() if prop is not None else "DEFAULT"
        if mode == "POLLING" or mode == "FANOUT":
            return mode  # type: ignore[return-value]  # one of the two literals
        if mode != "DEFAULT":
            assert prop is not None
            raise PropertiesError(
                f"unknown retrieval mode {prop.value!r} (FANOUT, POLLING, DEFAULT)",
                key=prop.key,
                line=prop.line,
            )
        # The KCL's DEFAULT: polling when a polling property is set (the numbers to other
        # than 0), enhanced fan-out otherwise.
        polling = any(key in self.values for key in _POLLING_SET) or any(
            self.number(key) for key in _POLLING_NONZERO
        )
        return "POLLING" if polling else "FANOUT"

    def _response_timeout(self) -> float | None:
        seconds = self.number("timeoutInSeconds", minimum=1)
        return float(seconds) if seconds is not None else DEFAULT_RESPONSE_TIMEOUT

    def _leases(self) -> LeaseSettings:
        failover_ms = self.number("failoverTimeMillis", minimum=1) or KCL_FAILOVER_MS
        assignment_ms = self.number("leaseAssignmentIntervalMillis", minimum=1)
        handoff_ms = self.number("gracefulLeaseHandoffTimeoutMillis", minimum=1)
        sync_ms = self.number("shardSyncIntervalMillis", minimum=1)
        parent_ms = self.number("parentShardPollIntervalMillis", minimum=1)
        handoff = self.flag("isGracefulLeaseHandoffEnabled")
        cleanup = self.flag("cleanupLeasesUponShardCompletion")
        steal = self.number("maxLeasesToStealAtOneTime")
        renewers = self.number("maxLeaseRenewalThreads", minimum=1)
        try:
            return LeaseSettings(
                failover_time=failover_ms / 1000,
                take_interval=assignment_ms / 1000 if assignment_ms else None,
                max_leases_per_worker=self.number("maxLeasesForWorker", minimum=1),
                max_leases_to_steal_at_once=1 if steal is None else steal,
                shard_sync_interval=(sync_ms or 60_000) / 1000,
                parent_poll_interval=(parent_ms or 10_000) / 1000,
                cleanup_finished_leases=True if cleanup is None else cleanup,
                handoff=True if handoff is None else handoff,
                handoff_timeout=(handoff_ms or 30_000) / 1000,
                renew_concurrency=renewers or 32,
            )
        except ValueError as exc:
            raise PropertiesError(f"the lease timing does not hold together: {exc}") from None


def _endpoint(value: str | None) -> str | None:
    """An endpoint as the KCL 1.x spelt it too (a host name): with a scheme."""
    value = (value or "").strip()
    if not value:
        return None
    return value if "://" in value else f"https://{value}"
