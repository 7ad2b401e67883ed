"""Where the source records its batch ends: ``metadataPath`` parsed and checked.

``s3://bucket/prefix`` (the default to use on a cluster: every executor reaches it with the
standard AWS credential chain), ``dynamodb://table`` (a DynamoDB table, created on demand), or
a directory (``file:///...`` or a plain path) that the driver and every executor share.

Run ids and shard ids become path components (S3 keys, file names, DynamoDB sort keys), so
both are checked before use: a run id read from a checkpoint that was edited or corrupted
must not walk out of the metadata location.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from shardflow.aws.settings import AwsSettings
from shardflow.errors import SourceMetadataError, SparkOptionError

# The run id is ``uuid4().hex``: exactly what the source writes into the query's first offset.
_RUN_ID = re.compile(r"[0-9a-f]{32}")
# Kinesis shard ids look like ``shardId-000000000007``; emulators stay within this alphabet.
_SHARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# S3 bucket names: 3-63 lowercase letters, digits, dots and hyphens.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# DynamoDB table names: 3-255 of letters, digits, _ . -
_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")


class StoreKind(StrEnum):
    LOCAL = "local"
    S3 = "s3"
    DYNAMODB = "dynamodb"


@dataclass(frozen=True, slots=True)
class MetadataLocation:
    """A checked ``metadataPath``: the kind of store, and where in it (picklable)."""

    kind: StoreKind
    # LOCAL: the directory; S3: the bucket; DYNAMODB: the table.
    where: str
    # S3 only: the key prefix inside the bucket ("" for the bucket's root), without slashes
    # at either end.
    prefix: str = ""
    # How the executors reach S3 or DynamoDB (region, endpoint); unused for LOCAL.
    aws: AwsSettings = field(default_factory=AwsSettings)

    def __str__(self) -> str:
        if self.kind is StoreKind.S3:
            return f"s3://{self.where}/{self.prefix}".rstrip("/")
        if self.kind is StoreKind.DYNAMODB:
            return f"dynamodb://{self.where}"
        return self.where


def parse_location(text: str, aws: AwsSettings) -> MetadataLocation:
    """Check ``metadataPath``; raises :class:`SparkOptionError` naming what is wrong."""
    cleaned = text.strip()
    scheme = cleaned.partition("://")[0].lower() if "://" in cleaned else ""
    if scheme in ("s3", "s3a", "s3n"):
        parts = urlsplit(cleaned)
        bucket = parts.netloc
        if not _BUCKET.fullmatch(bucket):
            raise SparkOptionError(
                "metadataPath", f"{bucket!r} is not an S3 bucket name (s3://bucket/prefix)"
            )
        prefix = parts.path.strip("/")
        if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
            raise SparkOptionError(
                "metadataPath", f"the S3 prefix {prefix!r} has empty, . or .. parts"
            )
        return MetadataLocation(StoreKind.S3, bucket, prefix, aws)
    if scheme == "dynamodb":
        table = cleaned.split("://", 1)[1].strip("/")
        if not _TABLE.fullmatch(table):
            raise SparkOptionError(
                "metadataPath", f"{table!r} is not a DynamoDB table name (dynamodb://table)"
            )
        return MetadataLocation(StoreKind.DYNAMODB, table, aws=aws)
    if scheme == "file":
        path = urlsplit(cleaned).path
        if not path:
            raise SparkOptionError("metadataPath", "file:// needs a path, e.g. file:///mnt/meta")
        return MetadataLocation(StoreKind.LOCAL, path)
    if scheme:
        raise SparkOptionError(
            "metadataPath",
            f"{scheme}:// is not supported: use s3://bucket/prefix, dynamodb://table or a "
            "directory shared by the driver and every executor",
        )
    return MetadataLocation(StoreKind.LOCAL, cleaned)


def checked_run_id(run_id: str) -> str:
    """``run_id`` if it is one the source made; raises :class:`SourceMetadataError` if not."""
    if not _RUN_ID.fullmatch(run_id):
        raise SourceMetadataError(
            f"the checkpoint's offset names run {run_id[:80]!r}, which is not a run id of the "
            "shardflow source (32 hex digits): the checkpoint was edited or belongs to another "
            "source. Fix: start the query with a new checkpointLocation."
        )
    return run_id


def checked_shard_id(shard_id: str) -> str:
    """``shard_id`` if it is safe as a file name and key part; raises if not."""
    if not _SHARD_ID.fullmatch(shard_id):
        raise SourceMetadataError(
            f"shard id {shard_id[:140]!r} cannot name a batch end (letters, digits, _ . - only)"
        )
    return shard_id
