"""Turns whatever an AWS call raised into one of shardflow's typed errors.

The classes decide what callers do: retry (throttled, transient, expired iterator, in use),
give up with a clear message (not found, access denied, invalid argument), or, for conditional
writes, treat the failure as an answer (condition failed).
"""

from __future__ import annotations

import asyncio
from typing import Final
from urllib.parse import urlsplit

from botocore import exceptions as boto

from shardflow.aws.redaction import redact
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ConditionFailedError,
    ExpiredIteratorError,
    InvalidArgumentError,
    MissingCredentialsError,
    ResourceInUseError,
    ResourceNotFoundError,
    ThrottledError,
    TransientError,
)

THROTTLING_CODES: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "KMSThrottlingException",
        "SlowDown",
    }
)
TRANSIENT_CODES: Final = frozenset(
    {
        "InternalFailure",
        "InternalFailureException",
        "InternalServerError",
        "InternalError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "TransactionInProgressException",
    }
)
EXPIRED_CODES: Final = frozenset({"ExpiredIteratorException", "ExpiredNextTokenException"})
NOT_FOUND_CODES: Final = frozenset({"ResourceNotFoundException", "TableNotFoundException"})
IN_USE_CODES: Final = frozenset({"ResourceInUseException"})
ACCESS_CODES: Final = frozenset(
    {
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "ExpiredTokenException",
        "ExpiredToken",
        "MissingAuthenticationToken",
        "IncompleteSignature",
        # A stream encrypted with a key the caller cannot use: a permission problem to the user.
        "KMSAccessDeniedException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSNotFoundException",
        "KMSOptInRequired",
    }
)
INVALID_CODES: Final = frozenset(
    {"InvalidArgumentException", "ValidationException", "ValidationError", "SerializationException"}
)
CONDITION_CODES: Final = frozenset(
    {"ConditionalCheckFailedException", "TransactionConflictException"}
)

_BY_CODE: Final[list[tuple[frozenset[str], type[AwsError]]]] = [
    (THROTTLING_CODES, ThrottledError),
    (TRANSIENT_CODES, TransientError),
    (EXPIRED_CODES, ExpiredIteratorError),
    (NOT_FOUND_CODES, ResourceNotFoundError),
    (IN_USE_CODES, ResourceInUseError),
    (ACCESS_CODES, AccessDeniedError),
    (INVALID_CODES, InvalidArgumentError),
    (CONDITION_CODES, ConditionFailedError),
]

# Failures of the connection itself: the request may or may not have reached the service.
_NETWORK_ERRORS: Final = (
    boto.EndpointConnectionError,
    boto.ConnectionClosedError,
    boto.ConnectTimeoutError,
    boto.ReadTimeoutError,
    boto.ResponseStreamingError,
    boto.HTTPClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


def error_class_for_code(code: str, status: int | None = None) -> type[AwsError]:
    """The shardflow error class for an AWS error code (as in PutRecords' per-entry ErrorCode)."""
    for codes, cls in _BY_CODE:
        if code in codes:
            return cls
    if status is not None and status >= 500:
        return TransientError
    if status == 429:
        return ThrottledError
    if status in (401, 403):
        return AccessDeniedError
    return AwsError


def classify(
    exc: BaseException,
    *,
    operation: str,
    stream: str | None = None,
    shard_id: str | None = None,
) -> AwsError:
    """A typed, credential-free :class:`AwsError` describing ``exc``."""
    if isinstance(exc, AwsError):
        return exc

    def make(cls: type[AwsError], message: str, code: str, status: int | None = None) -> AwsError:
        return cls(
            redact(message),
            operation=operation,
            code=code,
            status=status,
            stream=stream,
            shard_id=shard_id,
        )

    if isinstance(exc, boto.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = str(err.get("Message") or code or "AWS call failed")
        return make(error_class_for_code(code, status), message, code, status)
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return make(MissingCredentialsError, NO_CREDENTIALS, "NoCredentials")
    if isinstance(exc, boto.CredentialRetrievalError):
        return make(AccessDeniedError, "AWS credentials could not be retrieved", "Credentials")
    if isinstance(exc, _NETWORK_ERRORS):
        message = f"{type(exc).__name__}: {exc}{_local_stack_hint(exc)}"
        return make(TransientError, message, type(exc).__name__)
    if isinstance(exc, OSError):
        return make(TransientError, f"{type(exc).__name__}: {exc}", type(exc).__name__)
    if isinstance(exc, boto.ParamValidationError):
        return make(InvalidArgumentError, str(exc), "ParamValidation")
    # botocore raises ResponseParserError when a response is cut or garbled mid-way.
    if type(exc).__name__ in {
        "ResponseParserError",
        "IncompleteReadError",
        "ServerDisconnectedError",
    }:
        return make(TransientError, f"{type(exc).__name__}: {exc}", type(exc).__name__)
    return make(AwsError, f"{type(exc).__name__}: {exc}", type(exc).__name__)


NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE "
    "(a profile of ~/.aws/credentials), or run where a role provides them; for the local stack: "
    'eval "$(shardflow local up --quiet)"'
)
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _local_stack_hint(exc: BaseException) -> str:
    """For a connection refused on a loopback endpoint: the local stack is probably down."""
    if not isinstance(exc, boto.EndpointConnectionError):
        return ""
    url = str(exc.kwargs.get("endpoint_url", ""))
    if urlsplit(url).hostname not in _LOOPBACK_HOSTS:
        return ""
    return (
        f"; nothing answers at {url}: is the local stack running? "
        "`shardflow local status` shows it (`shardflow local up` starts it)"
    )
