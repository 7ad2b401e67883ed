"""Genuine AWS JSON-protocol answers: error responses and PutRecords results.

The texts imitate what Kinesis and DynamoDB really send, so that code under test meets the
same codes, statuses and messages as in production.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

_STATUS_BY_CODE: Final = {
    "InternalFailure": 500,
    "InternalFailureException": 500,
    "InternalServerError": 500,
    "ServiceUnavailable": 503,
    "ServiceUnavailableException": 503,
}
_CONTENT_TYPE: Final = {"DynamoDB": "application/x-amz-json-1.0"}
_DEFAULT_CONTENT_TYPE: Final = "application/x-amz-json-1.1"
_TYPE_PREFIX: Final = {"DynamoDB": "com.amazonaws.dynamodb.v20120810#"}


@dataclass(frozen=True, slots=True)
class Context:
    """Where a request went: fills the blanks of genuine error messages."""

    service: str = "Kinesis"
    operation: str = ""
    stream: str | None = None
    shard_id: str | None = None
    account: str = "123456789012"
    region: str = "us-east-1"


@dataclass(frozen=True, slots=True)
class WireResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def default_status(code: str) -> int:
    """The HTTP status AWS uses for ``code`` (client errors are 400 in the JSON protocol)."""
    return _STATUS_BY_CODE.get(code, 400)


def default_message(code: str, ctx: Context) -> str:
    """The message AWS sends with ``code`` (for DynamoDB or Kinesis)."""
    stream = ctx.stream or "unknown"
    if ctx.service == "DynamoDB":
        return _dynamodb_message(code)
    if code == "ProvisionedThroughputExceededException":
        return (
            f"Rate exceeded for shard {ctx.shard_id or 'shardId-000000000000'} "
            f"in stream {stream} under account {ctx.account}."
        )
    if code == "LimitExceededException":
        return f"Rate exceeded for stream {stream} under account {ctx.account}."
    if code == "ExpiredIteratorException":
        now = datetime.now(UTC)
        created = now - timedelta(minutes=6)
        return (
            f"Iterator expired. The iterator was created at time {_aws_time(created)} while "
            f"right now it is {_aws_time(now)} which is further in the future than the "
            "tolerated delay of 300000 milliseconds."
        )
    if code == "AccessDeniedException":
        action = f"kinesis:{ctx.operation or 'PutRecords'}"
        return (
            f"User: arn:aws:iam::{ctx.account}:user/shardflow-fault-proxy is not authorized to "
            f"perform: {action} on resource: arn:aws:kinesis:{ctx.region}:{ctx.account}:"
            f"stream/{stream} because no identity-based policy allows the {action} action"
        )
    if code == "ResourceNotFoundException":
        return f"Stream {stream} under account {ctx.account} not found."
    if code in ("InternalFailure", "InternalFailureException"):
        return "Internal service failure."
    if code in ("ServiceUnavailable", "ServiceUnavailableException"):
        return "Service Unavailable"
    return code


def _dynamodb_message(code: str) -> str:
    if code == "ProvisionedThroughputExceededException":
        return (
            "The level of configured provisioned throughput for the table was exceeded. "
            "Consider increasing your provisioning level with the UpdateTable API."
        )
    if code == "ResourceNotFoundException":
        return "Requested resource not found"
    if code == "InternalServerError":
        return "Internal server error"
    return code


def _aws_time(moment: datetime) -> str:
    return moment.strftime("%a %b %d %H:%M:%S UTC %Y")


def error_response(
    code: str, ctx: Context, *, status: int | None = None, message: str | None = None
) -> WireResponse:
    """A JSON-protocol error response as the service would send it."""
    body = {
        "__type": _TYPE_PREFIX.get(ctx.service, "") + code,
        "message": message if message is not None else default_message(code, ctx),
    }
    return json_response(
        body, service=ctx.service, status=status if status is not None else default_status(code)
    )


def json_response(
    doc: Mapping[str, Any], *, service: str = "Kinesis", status: int = 200
) -> WireResponse:
    body = json.dumps(doc, separators=(",", ":")).encode()
    headers = {
        "Content-Type": _CONTENT_TYPE.get(service, _DEFAULT_CONTENT_TYPE),
        "x-amzn-RequestId": str(uuid.uuid4()),
    }
    return WireResponse(status, headers, body)


def failed_entry(code: str, ctx: Context) -> dict[str, str]:
    """One PutRecords result entry that failed with ``code``."""
    return {"ErrorCode": code, "ErrorMessage": default_message(code, ctx)}


def without_entries(request: Mapping[str, Any], failed: Sequence[int]) -> dict[str, Any]:
    """The PutRecords request minus the entries at ``failed`` positions."""
    gone = set(failed)
    kept = [r for i, r in enumerate(request["Records"]) if i not in gone]
    return {**request, "Records": kept}


def merge_results(
    upstream: Mapping[str, Any] | None, failures: Mapping[int, dict[str, str]], total: int
) -> dict[str, Any]:
    """The PutRecords response for ``total`` entries: ``failures`` at their positions, the
    upstream results (for the forwarded entries, in order) everywhere else."""
    upstream_results = upstream["Records"] if upstream is not None else []
    if len(upstream_results) != total - len(failures):
        raise ValueError(
            f"upstream answered {len(upstream_results)} entries, "
            f"{total - len(failures)} were forwarded"
        )
    forwarded = iter(upstream_results)
    results: list[dict[str, Any]] = []
    for position in range(total):
        entry = failures.get(position)
        results.append(entry if entry is not None else next(forwarded))
    merged: dict[str, Any] = dict(upstream or {})
    merged["Records"] = results
    merged["FailedRecordCount"] = sum(1 for r in results if "ErrorCode" in r)
    return merged
