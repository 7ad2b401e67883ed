"""Batch ends as S3 objects: ``s3://bucket/prefix/<run id>/<batch>/<shard id>.json``.

The first attempt wins with a conditional write: ``PutObject`` with ``If-None-Match: *``
succeeds only if no object has that key (S3 answers 412 Precondition Failed otherwise, and 409
ConditionalRequestConflict while a competing write to the key is in flight: the loser then
reads the winner's object). S3 is strongly consistent for reads after writes, so a replay
reads exactly what was recorded. Executors reach S3 with the standard AWS credential chain.
"""

from __future__ import annotations

import asyncio
from typing import Any

from botocore.exceptions import ClientError

from shardflow.spark.source.metadata_location import MetadataLocation
from shardflow.spark.source.metadata_store import batch_name
from shardflow.spark.source.store_aws import AwsBatchEnds

# A competing conditional write in flight (409) settles within milliseconds; retry a few times.
_CONFLICT_RETRIES = 5
_CONFLICT_PAUSE = 0.1
_HINTS = {
    "NoSuchBucket": "create the bucket, or fix the bucket in metadataPath",
    "404": "no such bucket: create the bucket, or fix the bucket in metadataPath",
    "403": (
        "access denied: give the driver and every executor s3:GetObject, s3:PutObject, "
        "s3:ListBucket and s3:DeleteObject on it (the standard AWS credential chain is used)"
    ),
    "AccessDenied": (
        "give the driver and every executor s3:GetObject, s3:PutObject, s3:ListBucket and "
        "s3:DeleteObject on it (the standard AWS credential chain is used)"
    ),
    "NotImplemented": "the S3 service at this endpoint does not support conditional writes",
}


class S3BatchEnds(AwsBatchEnds):
    service = "s3"
    hints = _HINTS

    def __init__(self, location: MetadataLocation, run_id: str) -> None:
        super().__init__(location, run_id)
        self.bucket = location.where
        self.run_prefix = "/".join(p for p in (location.prefix, self.run_id) if p) + "/"

    def _key(self, batch: int, shard_id: str) -> str:
        return f"{self.run_prefix}{batch_name(batch)}/{shard_id}.json"

    def prepare(self) -> None:
        self._run("checking the metadata bucket", lambda s3: s3.head_bucket(Bucket=self.bucket))

    def _read(self, batch: int, shard_id: str) -> str | None:
        return self._run(
            "reading a batch end from", lambda s3: self._get(s3, self._key(batch, shard_id))
        )

    async def _get_text(self, client: Any, batch: int, shard_id: str) -> str | None:
        return await self._get(client, self._key(batch, shard_id))

    async def _get(self, s3: Any, key: str) -> str | None:
        try:
            answer = await s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        async with answer["Body"] as body:
            data: bytes = await body.read()
        return data.decode()

    def _create(self, batch: int, shard_id: str, text: str) -> bool:
        return self._run(
            "recording a batch end in",
            lambda s3: self._put_new(s3, self._key(batch, shard_id), text),
        )

    async def _put_new(self, s3: Any, key: str, text: str) -> bool:
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                await s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=text.encode(),
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
                return True
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                if code == "PreconditionFailed":
                    return False
                if code != "ConditionalRequestConflict" or attempt == _CONFLICT_RETRIES:
                    raise
                await asyncio.sleep(_CONFLICT_PAUSE * (attempt + 1))
        raise AssertionError("unreachable")

    def _delete_before(self, batch: int) -> None:
        self._run("forgetting old batch ends in", lambda s3: self._delete_old(s3, batch))

    async def _delete_old(self, s3: Any, batch: int) -> None:
        old: list[dict[str, str]] = []
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = await s3.list_objects_v2(Bucket=self.bucket, Prefix=self.run_prefix, **extra)
            for item in page.get("Contents", []):
                name = item["Key"][len(self.run_prefix) :].partition("/")[0]
                if name.isdigit() and int(name) < batch:
                    old.append({"Key": item["Key"]})
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        for i in range(0, len(old), 1000):
            await s3.delete_objects(
                Bucket=self.bucket, Delete={"Objects": old[i : i + 1000], "Quiet": True}
            )
