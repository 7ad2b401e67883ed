"""Every error shardflow raises, as types.

Errors carry the context a user needs to act (stream, shard, sequence number, AWS error code)
and never credentials. Catch :class:`ShardflowError` for everything, or a narrower class. The
module is grouped as the hierarchy is::

    ShardflowError
        AwsError
            ThrottledError
            TransientError
            ExpiredIteratorError
            ResourceNotFoundError
            ResourceInUseError
            AccessDeniedError
                MissingCredentialsError
                AssumeRoleError
            InvalidArgumentError
            ConditionFailedError
        ConfigurationError
            MissingRegionError
            UnknownRegionError (also AwsError)
            InvalidStreamArnError (also ValueError)
            StreamRegionMismatchError
        StartTimeoutError
        RecordTooLargeError
        InvalidPartitionKeyError
            InvalidExplicitHashKeyError
        AggregationError
        DeserializationError
        ProducerError
            ProducerClosedError
            RecordDeliveryError
        HandlerError
        DispatchStoppedError
            RetriesExhaustedError
            DeadLetteringFailedError
        KeyFunctionError
        KeyBlockedError
        RecordExpiredError
        BatchResultError (also TypeError)
        ShardLeaseLostError
        MalformedLeaseError
        AckError
            RecordNotDeliveredError
            DeliveryOrderError
        CompletedStateError
        DeadLetterWriteError
        MalformedDeadLetterError
        ClaimInProgressError
        SparkOptionError (also ValueError)
            UnknownSparkOptionError
        SparkSourceError
            DataLossError
            BatchEndConflictError
            SourceMetadataError
                MetadataOutOfStepError
        SparkSinkSchemaError (also ValueError)
        SparkSinkWriteError
        LocalStackError
            EmulatorNotInstalledError
                NodeModulesNotFoundError
            ServerStartError
                ServerExitedError
                ServerNotReadyError
"""

from __future__ import annotations

from shardflow.deprecation import renamed


class ShardflowError(Exception):
    """Base class of all shardflow errors."""


# --- AWS calls -------------------------------------------------------------------------------


class AwsError(ShardflowError):
    """An AWS call failed. ``code`` is the AWS error code (e.g. ``ResourceNotFoundException``)."""

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        code: str = "",
        stream: str | None = None,
        shard_id: str | None = None,
        status: int | None = None,
    ) -> None:
        self.operation = operation
        self.code = code
        self.stream = stream
        self.shard_id = shard_id
        self.status = status
        where = ", ".join(
            part
            for part in (
                f"operation={operation}" if operation else "",
                f"code={code}" if code else "",
                f"stream={stream}" if stream else "",
                f"shard={shard_id}" if shard_id else "",
            )
            if part
        )
        super().__init__(f"{message} ({where})" if where else message)


class ThrottledError(AwsError):
    """Throughput or request-rate limit exceeded (ProvisionedThroughputExceeded, LimitExceeded...)."""

    retryable = True


class TransientError(AwsError):
    """A failure that is expected to pass: 5xx, timeouts, dropped connections."""

    retryable = True


class ExpiredIteratorError(AwsError):
    """A shard iterator is older than 5 minutes; get a new one at the last position."""

    retryable = True


class ResourceNotFoundError(AwsError):
    """The stream, shard, table or consumer does not exist (wrong name, wrong region?)."""


class ResourceInUseError(AwsError):
    """The resource is being created, updated or deleted, or a subscription is still active."""

    retryable = True


class AccessDeniedError(AwsError):
    """The credentials lack a permission (or KMS access) for this call."""


class MissingCredentialsError(AccessDeniedError):
    """No AWS credentials were found anywhere the standard chain looks."""


class AssumeRoleError(AccessDeniedError):
    """STS refused to let these credentials assume ``role_arn`` (AccessDenied: the role's trust
    policy, a wrong external id, or no sts:AssumeRole permission). ``operation`` is
    ``AssumeRole``; ``code`` the STS error code."""

    def __init__(
        self, role_arn: str, message: str, *, code: str, stream: str | None = None
    ) -> None:
        self.role_arn = role_arn
        super().__init__(
            f"cannot assume role {role_arn}: {message} - check the role's trust policy "
            "(it must trust these credentials, with the external id if it asks one) and the "
            "caller's sts:AssumeRole permission",
            operation="AssumeRole",
            code=code,
            stream=stream,
        )


class InvalidArgumentError(AwsError):
    """The request was rejected as invalid; retrying the same request will not help."""


class ConditionFailedError(AwsError):
    """A conditional DynamoDB write found the item changed (someone else wrote it first)."""


# --- Configuration ---------------------------------------------------------------------------


class ConfigurationError(ShardflowError):
    """The AWS configuration is incomplete; the message names what to set."""


class MissingRegionError(ConfigurationError):
    """No AWS region is configured (argument, environment, profile)."""


class UnknownRegionError(ConfigurationError, AwsError):
    """The region is none the SDK knows, and the endpoint (an emulator, typically: moto's
    server answers such calls with a 500 web page) refused it. ``region`` is the one given,
    ``closest`` the known regions it most resembles (a typo?), maybe none. An :class:`AwsError`
    too (``operation``, ``code``; not ``retryable``), as the call that found it raised it."""

    def __init__(
        self,
        region: str,
        *,
        closest: tuple[str, ...],
        endpoint: str,
        status: int,
        operation: str,
    ) -> None:
        self.region = region
        self.closest = closest
        hint = f"did you mean {' or '.join(closest)}? " if closest else ""
        super().__init__(
            f"region {region!r} is not an AWS region, and {endpoint} refused it (HTTP {status}, "
            f"a web page): {hint}Set --region, AWS_REGION or AwsSettings(region=...)",
            operation=operation,
            code="UnknownRegion",
            status=status,
        )


class InvalidStreamArnError(ConfigurationError, ValueError):
    """A stream ARN that is not ``arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME``;
    ``arn`` is the text given, ``problem`` what is wrong with it."""

    def __init__(self, arn: str, problem: str) -> None:
        self.arn = arn
        self.problem = problem
        super().__init__(
            f"{arn!r} is not a Kinesis stream ARN ({problem}): expected "
            "arn:aws:kinesis:REGION:ACCOUNT:stream/NAME"
        )


class StreamRegionMismatchError(ConfigurationError):
    """A stream given by ARN lives in another region than the one configured (Kinesis serves a
    stream in its own region only)."""

    def __init__(self, arn: str, *, arn_region: str, configured: str) -> None:
        self.arn = arn
        self.arn_region = arn_region
        self.configured = configured
        super().__init__(
            f"stream {arn} is in region {arn_region}, but the region configured is "
            f"{configured}: leave the region unset (the ARN's is used) or set {arn_region}"
        )


# --- Records: size, keys, aggregation, deserialization ---------------------------------------


class StartTimeoutError(ShardflowError):
    """A consumer could not start within ``ConsumerSettings.start_timeout``: a call it makes at
    start (the stream's summary) kept failing with errors that may pass (5xx, throttling,
    timeouts: a brownout). The last of them is the ``__cause__``; errors that cannot pass (a
    missing stream, access denied) are raised as they are, at once."""

    def __init__(self, message: str, *, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(message)


class RecordTooLargeError(ShardflowError):
    """A record (data plus partition key) exceeds the Kinesis record size limit."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"record of {size} bytes exceeds the limit of {limit} bytes")


class InvalidPartitionKeyError(ShardflowError):
    """A partition key is empty or longer than 256 Unicode characters."""


class InvalidExplicitHashKeyError(InvalidPartitionKeyError):
    """An explicit hash key is not a decimal integer between 0 and 2**128 - 1."""


class AggregationError(ShardflowError):
    """An aggregated (KPL) record could not be decoded.

    ``reason`` is one of ``"md5"``, ``"truncated"``, ``"protobuf"``, ``"index"``, ``"key"``.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        shard_id: str | None = None,
        sequence_number: str | None = None,
    ) -> None:
        self.reason = reason
        self.shard_id = shard_id
        self.sequence_number = sequence_number
        where = ", ".join(
            p
            for p in (
                f"shard={shard_id}" if shard_id else "",
                f"sequence_number={sequence_number}" if sequence_number else "",
            )
            if p
        )
        super().__init__(
            f"malformed aggregated record ({reason}): {detail}" + (f" [{where}]" if where else "")
        )


class DeserializationError(ShardflowError):
    """A record's payload could not be turned into a value by the configured deserializer."""

    def __init__(
        self,
        detail: str,
        *,
        shard_id: str | None = None,
        sequence_number: str | None = None,
        sub_sequence_number: int = 0,
    ) -> None:
        self.shard_id = shard_id
        self.sequence_number = sequence_number
        self.sub_sequence_number = sub_sequence_number
        super().__init__(
            f"cannot deserialize record {sequence_number}/{sub_sequence_number} "
            f"of shard {shard_id}: {detail}"
        )


# --- Producer --------------------------------------------------------------------------------


class ProducerError(ShardflowError):
    """Base class of producer errors."""


class ProducerClosedError(ProducerError):
    """``put`` was called on a producer that is closing or closed."""


class RecordDeliveryError(ProducerError):
    """A record could not be written within the retry budget.

    ``code`` is the last error code Kinesis returned for it (or the exception class name).
    """

    def __init__(self, message: str, *, code: str, attempts: int, stream: str) -> None:
        self.code = code
        self.attempts = attempts
        self.stream = stream
        super().__init__(f"{message} (code={code}, attempts={attempts}, stream={stream})")


# --- Consumer: handlers and delivery (ordering modes, retries, failure policies) -------------


class HandlerError(ShardflowError):
    """The user's handler raised while processing a record; the original error is ``__cause__``.

    ``sequence_number``/``sub_sequence_number`` name the record (the first of the batch for a
    batch handler). Records before it that the handler finished stay acknowledged.
    """

    def __init__(
        self,
        error: BaseException,
        *,
        stream: str,
        shard_id: str,
        sequence_number: str,
        sub_sequence_number: int = 0,
    ) -> None:
        self.error = error
        self.stream = stream
        self.shard_id = shard_id
        self.sequence_number = sequence_number
        self.sub_sequence_number = sub_sequence_number
        super().__init__(
            f"handler failed on record {sequence_number}/{sub_sequence_number} of shard "
            f"{shard_id} (stream {stream}): {type(error).__name__}: {error}"
        )


class DispatchStoppedError(ShardflowError):
    """Dispatching of a shard's records stopped; records not finished stay unacknowledged.

    They are not checkpointed, so a restart replays them. ``position`` names the record that
    caused the stop (``sequence_number/sub_sequence_number``); the underlying failure is
    ``__cause__``.
    """

    def __init__(self, message: str, *, shard_id: str, position: str) -> None:
        self.shard_id = shard_id
        self.position = position
        super().__init__(f"{message} (shard {shard_id or '?'}, record {position})")


class RetriesExhaustedError(DispatchStoppedError):
    """Policy ``stop-shard``: a record still failed after ``attempts`` handler calls."""

    def __init__(self, *, shard_id: str, position: str, attempts: int) -> None:
        self.attempts = attempts
        super().__init__(
            f"handler failed {attempts} time(s); dispatching stopped",
            shard_id=shard_id,
            position=position,
        )


class DeadLetteringFailedError(DispatchStoppedError):
    """A record could not be written to the dead-letter destination, so it cannot be skipped."""

    def __init__(self, *, shard_id: str, position: str) -> None:
        super().__init__(
            "dead-letter write failed; dispatching stopped", shard_id=shard_id, position=position
        )


class KeyFunctionError(ShardflowError):
    """The ordering-key function raised for a record; the record was not accepted."""

    def __init__(self, *, shard_id: str, position: str) -> None:
        self.shard_id = shard_id
        self.position = position
        super().__init__(
            f"ordering key function failed on record {position} of shard {shard_id or '?'}"
        )


class KeyBlockedError(ShardflowError):
    """Why a record went to the dead letters unhandled: an earlier record of its key failed
    (policy ``block-key``) and the key was not released yet. ``blocked_by`` names that record."""

    def __init__(self, key: str, *, blocked_by: str) -> None:
        self.key = key
        self.blocked_by = blocked_by
        super().__init__(f"key {key!r} is blocked since record {blocked_by} failed")


class RecordExpiredError(ShardflowError):
    """Why a record went to the dead letters unhandled: it was older than ``max_record_age``
    when its turn came (``age`` seconds since it arrived in the stream)."""

    def __init__(self, *, age: float, max_age: float) -> None:
        self.age = age
        self.max_age = max_age
        super().__init__(f"record is {age:.1f} s old, older than max_record_age {max_age:g} s")


class BatchResultError(ShardflowError, TypeError):
    """A batch handler returned something other than None or the records of its batch that
    failed (partial batch failure reporting)."""


# --- Consumer: leases, acknowledgements and checkpoints --------------------------------------


class ShardLeaseLostError(ShardflowError):
    """This worker no longer owns the shard's lease; stop processing and do not checkpoint."""

    def __init__(self, shard_id: str, *, owner: str | None = None) -> None:
        self.shard_id = shard_id
        self.owner = owner
        super().__init__(
            f"lease for shard {shard_id} is lost" + (f" (now owned by {owner})" if owner else "")
        )


class MalformedLeaseError(ShardflowError):
    """A lease table item lacks an attribute KCL requires or holds it with the wrong type."""

    def __init__(self, lease_key: str, reason: str) -> None:
        self.lease_key = lease_key
        self.reason = reason
        super().__init__(f"lease item {lease_key!r} is malformed: {reason}")


class AckError(ShardflowError):
    """Per-record acknowledgement was misused (a programming error in the caller)."""


class RecordNotDeliveredError(AckError):
    """An acknowledgement named a position this shard's tracker never delivered."""

    def __init__(self, shard_id: str, position: str) -> None:
        self.shard_id = shard_id
        self.position = position
        super().__init__(f"record {position} of shard {shard_id or '?'} was never delivered")


class DeliveryOrderError(AckError):
    """A record was delivered out of shard order: positions must strictly increase."""

    def __init__(self, shard_id: str, position: str, last: str | None) -> None:
        self.shard_id = shard_id
        self.position = position
        self.last = last
        super().__init__(
            f"record {position} of shard {shard_id or '?'} delivered after {last}"
            if last is not None
            else f"{position} is not a record position (shard {shard_id or '?'})"
        )


class CompletedStateError(ShardflowError):
    """Stored state of records completed beyond a checkpoint is malformed or of an unknown version."""


# --- Dead letters and idempotency ------------------------------------------------------------


class DeadLetterWriteError(ShardflowError):
    """Dead letters could not be written; none of them counts as dead-lettered (do not checkpoint).

    ``destination`` describes where they were going; ``count`` is how many letters the failed
    write held. The underlying failure is ``__cause__``.
    """

    def __init__(self, destination: str, count: int, reason: str) -> None:
        self.destination = destination
        self.count = count
        self.reason = reason
        super().__init__(f"could not write {count} dead letter(s) to {destination}: {reason}")


class MalformedDeadLetterError(ShardflowError):
    """A stored dead letter cannot be read: not JSON, a field missing or of the wrong type, or
    a newer format version. ``where`` names it (file and line, or stream, shard and sequence)."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"malformed dead letter at {where}: {reason}")


class ClaimInProgressError(ShardflowError):
    """Another handler holds a live idempotency claim on this key; the record is not handled yet.

    Retry later (the claim ends when its holder completes or releases it, or when it expires);
    do not checkpoint past the record meanwhile.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"idempotency key {key!r} is being handled elsewhere (claim in progress)")


# --- Spark source and sink -------------------------------------------------------------------


class SparkOptionError(ShardflowError, ValueError):
    """A ``shardflow`` Spark source/sink option is missing or malformed; names the option."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"option {option}: {problem}")


class UnknownSparkOptionError(SparkOptionError):
    """An option the ``shardflow`` source or sink does not know (a typo, usually): refused rather
    than ignored. ``closest`` is the known option it most resembles, if any; ``known`` all of
    them."""

    def __init__(
        self, option: str, *, where: str, closest: str | None, known: tuple[str, ...]
    ) -> None:
        self.closest = closest
        self.known = known
        hint = f"did you mean {closest}?" if closest else "known options: " + ", ".join(known)
        super().__init__(option, f"not an option of the shardflow {where}; {hint}")


class SparkSourceError(ShardflowError):
    """The ``shardflow`` Spark source cannot go on reading; the message says why and what to do."""


class DataLossError(SparkSourceError):
    """Records the query should have read are gone (past retention, or the stream was recreated).

    Raised with ``failOnDataLoss=true``; with ``false`` the source skips ahead and reports the
    loss instead. ``after`` is the position the query had reached, ``resumed_at`` the first
    record still available (None if the shard holds none).
    """

    def __init__(self, *, stream: str, shard_id: str, after: str, resumed_at: str | None) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self.after = after
        self.resumed_at = resumed_at
        first = f"the oldest record left is {resumed_at}" if resumed_at else "no record is left"
        super().__init__(
            f"data loss on shard {shard_id} of stream {stream}: the query had read up to "
            f"{after}, which is no longer in the shard ({first}); records in between expired "
            "or were deleted. Set failOnDataLoss=false to skip ahead and report the loss."
        )


class BatchEndConflictError(SparkSourceError):
    """Two attempts of one micro-batch task disagreed on where the batch ends for a shard.

    The end recorded first is binding; this attempt had already handed out a different set of
    records, so it fails and Spark's retry reads exactly the recorded ones.
    """

    def __init__(self, *, shard_id: str, batch: int, recorded: str, read: str) -> None:
        self.shard_id = shard_id
        self.batch = batch
        super().__init__(
            f"batch {batch}, shard {shard_id}: another attempt recorded the end {recorded}, "
            f"this one read to {read}; failing so that the retry reads the recorded records"
        )


class SourceMetadataError(SparkSourceError):
    """The source's metadata at ``metadataPath`` is missing or unreadable for a batch it needs."""


class MetadataOutOfStepError(SourceMetadataError):
    """The query's checkpoint and the source's metadata do not belong together (a changed,
    cleaned or restored ``metadataPath`` or checkpoint); the message names the fix. Raised
    instead of reading records other than the ones the checkpoint's batch stands for."""


class SparkSinkSchemaError(ShardflowError, ValueError):
    """The DataFrame written to the ``shardflow`` sink lacks a column, has one of the wrong type,
    or has one the sink does not know; raised when Spark plans the write."""


class SparkSinkWriteError(ShardflowError):
    """A Spark task could not write its rows to Kinesis (a bad row, or records the producer
    gave up on); the task fails with it, so Spark retries or fails the job."""

    def __init__(self, stream: str, problem: str, *, failed: int = 0, written: int = 0) -> None:
        self.stream = stream
        self.failed = failed
        self.written = written
        super().__init__(f"writing to stream {stream}: {problem}")


# --- Local stack -----------------------------------------------------------------------------


class LocalStackError(ShardflowError):
    """The embedded local stack (moto, kinesis-local, kinesalite) failed or was misused."""


class EmulatorNotInstalledError(LocalStackError):
    """A program or package a local server needs is missing; the message says how to install it."""


class NodeModulesNotFoundError(EmulatorNotInstalledError):
    """The npm package of a Node emulator (kinesis-local, kinesalite) is not installed."""


class ServerStartError(LocalStackError):
    """A local server did not become ready. ``log_tail`` holds the last lines of its output."""

    def __init__(self, server: str, reason: str, *, log_path: str, log_tail: str) -> None:
        self.server = server
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail
        tail = f"\n--- last lines of {log_path} ---\n{log_tail}" if log_tail else ""
        super().__init__(f"{server} did not start: {reason}{tail}")


class ServerExitedError(ServerStartError):
    """A local server exited before it answered HTTP requests."""


class ServerNotReadyError(ServerStartError):
    """A local server was still not answering HTTP requests when the start-up deadline passed."""


__getattr__ = renamed(__name__, {"ShardLeaseLost": "ShardLeaseLostError"})
