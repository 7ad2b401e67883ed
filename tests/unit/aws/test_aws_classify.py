"""How failures of AWS calls become shardflow's typed errors."""

from __future__ import annotations

import pytest
from botocore import exceptions as boto
from botocore.parsers import ResponseParserError

from shardflow.aws import classify, error_class_for_code, register_secret
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


def _client_error(code: str, status: int | None, message: str = "it failed") -> boto.ClientError:
    response: dict[str, object] = {"Error": {"Code": code, "Message": message}}
    if status is not None:
        response["ResponseMetadata"] = {"HTTPStatusCode": status}
    return boto.ClientError(response, "PutRecords")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status", "expected", "retryable"),
    [
        ("ProvisionedThroughputExceededException", 400, ThrottledError, True),
        ("LimitExceededException", 400, ThrottledError, True),
        ("ThrottlingException", 400, ThrottledError, True),
        ("KMSThrottlingException", 400, ThrottledError, True),
        ("InternalFailure", 500, TransientError, True),
        ("ServiceUnavailable", 503, TransientError, True),
        ("InternalServerError", 500, TransientError, True),
        ("ExpiredIteratorException", 400, ExpiredIteratorError, True),
        ("ExpiredNextTokenException", 400, ExpiredIteratorError, True),
        ("ResourceNotFoundException", 400, ResourceNotFoundError, False),
        ("ResourceInUseException", 400, ResourceInUseError, True),
        ("AccessDeniedException", 400, AccessDeniedError, False),
        ("UnrecognizedClientException", 400, AccessDeniedError, False),
        ("KMSAccessDeniedException", 400, AccessDeniedError, False),
        ("InvalidArgumentException", 400, InvalidArgumentError, False),
        ("ValidationException", 400, InvalidArgumentError, False),
        ("ConditionalCheckFailedException", 400, ConditionFailedError, False),
    ],
)
def test_client_errors_are_classified_by_code(
    code: str, status: int, expected: type[AwsError], retryable: bool
) -> None:
    error = classify(
        _client_error(code, status), operation="PutRecords", stream="orders", shard_id="shard-1"
    )
    assert type(error) is expected
    assert error.retryable is retryable
    assert error.code == code
    assert error.status == status
    assert error.operation == "PutRecords"
    assert error.stream == "orders"
    assert error.shard_id == "shard-1"
    text = str(error)
    assert "it failed" in text
    for context in ("orders", "shard-1", code):
        assert context in text


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (500, TransientError),
        (502, TransientError),
        (503, TransientError),
        (504, TransientError),
        (429, ThrottledError),
        (401, AccessDeniedError),
        (403, AccessDeniedError),
        (400, AwsError),
        (404, AwsError),
        (None, AwsError),
    ],
)
def test_unknown_codes_fall_back_to_the_http_status(
    status: int | None, expected: type[AwsError]
) -> None:
    error = classify(_client_error("SomethingNew", status), operation="GetRecords")
    assert type(error) is expected
    assert error_class_for_code("SomethingNew", status) is expected


def test_a_known_code_wins_over_the_status() -> None:
    # Kinesis sends its client errors as 400; DynamoDB throttling too. The code decides.
    assert error_class_for_code("ProvisionedThroughputExceededException", 400) is ThrottledError
    assert error_class_for_code("ResourceNotFoundException", 500) is ResourceNotFoundError


def test_an_unknown_client_error_is_not_retryable() -> None:
    error = classify(_client_error("SomethingNew", 400), operation="GetRecords")
    assert not error.retryable


@pytest.mark.parametrize(
    "exc",
    [
        boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        boto.ConnectionClosedError(endpoint_url="http://127.0.0.1:9"),
        boto.ConnectTimeoutError(endpoint_url="http://127.0.0.1:9"),
        boto.ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
        boto.ResponseStreamingError(error="cut"),
        boto.HTTPClientError(error="weird"),
        boto.ProxyConnectionError(proxy_url="http://127.0.0.1:9"),
        TimeoutError(),
        ConnectionResetError("reset by peer"),
        OSError("network unreachable"),
        ResponseParserError("truncated body"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_network_failures_are_transient(exc: Exception) -> None:
    error = classify(exc, operation="GetRecords", stream="clicks")
    assert type(error) is TransientError
    assert error.retryable
    assert error.code == type(exc).__name__
    assert "clicks" in str(error)


def test_aiohttp_disconnects_without_botocore_wrapping_are_transient() -> None:
    class ServerDisconnectedError(Exception):  # named like aiohttp's
        pass

    error = classify(ServerDisconnectedError("gone"), operation="PutRecords")
    assert type(error) is TransientError


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (boto.NoCredentialsError(), "NoCredentials"),
        (
            boto.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
            "NoCredentials",
        ),
        (boto.CredentialRetrievalError(provider="sso", error_msg="expired"), "Credentials"),
    ],
)
def test_missing_credentials_are_access_errors(exc: Exception, code: str) -> None:
    error = classify(exc, operation="ListShards")
    assert isinstance(error, AccessDeniedError)
    assert not error.retryable
    assert error.code == code
    if code == "NoCredentials":  # typed, naming the variables to set
        assert isinstance(error, MissingCredentialsError)
        assert "AWS_ACCESS_KEY_ID" in str(error)
        assert "AWS_PROFILE" in str(error)


def test_connection_refused_on_loopback_suggests_the_local_stack() -> None:
    exc = boto.EndpointConnectionError(endpoint_url="http://127.0.0.1:9/")
    error = classify(exc, operation="ListStreams")
    assert "shardflow local status" in str(error)
    remote = classify(
        boto.EndpointConnectionError(endpoint_url="https://kinesis.eu-west-1.amazonaws.com/"),
        operation="ListStreams",
    )
    assert "local" not in str(remote)


def test_invalid_parameters_are_invalid_arguments() -> None:
    exc = boto.ParamValidationError(report="Missing required parameter StreamName")
    error = classify(exc, operation="PutRecords")
    assert type(error) is InvalidArgumentError
    assert "StreamName" in str(error)


def test_anything_else_is_a_plain_non_retryable_aws_error() -> None:
    error = classify(KeyError("odd"), operation="PutRecords")
    assert type(error) is AwsError
    assert not error.retryable
    assert error.code == "KeyError"


def test_a_typed_error_is_returned_unchanged() -> None:
    original = ThrottledError("slow down", operation="PutRecords")
    assert classify(original, operation="Other") is original


def test_messages_are_redacted() -> None:
    secret = "classify-Test-Secret-0123456789abcdef"
    register_secret(secret)
    message = (
        f"request with key {secret} and Credential=AKIAZZZZZZZZZZZZZZZZ/20240101/us-east-1/"
        "kinesis/aws4_request, Signature=0123456789abcdef0123456789abcdef failed"
    )
    error = classify(_client_error("InvalidSignatureException", 400, message), operation="X")
    text = f"{error} {error!r}"
    assert secret not in text
    assert "AKIAZZZZZZZZZZZZZZZZ" not in text
    assert "0123456789abcdef0123456789abcdef" not in text
    assert type(error) is AccessDeniedError
