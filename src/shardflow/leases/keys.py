"""Lease keys: a shard id in single-stream mode, ``<stream identifier>:<shard id>`` in multi-stream.

KCL's multi-stream mode names a stream by its serialized identifier
``<account id>:<stream name>:<creation epoch seconds>`` (stream names hold no colon), so a
multi-stream lease key splits at its last colon.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_STREAM_IDENTIFIER: Final = re.compile(r"(?P<account>[0-9]+):(?P<name>[^:]+):(?P<epoch>[0-9]+)")


@dataclass(frozen=True, slots=True)
class StreamIdentifier:
    """A stream in KCL's multi-stream mode: account, name and creation time (epoch seconds)."""

    account_id: str
    stream_name: str
    creation_epoch: int

    def __post_init__(self) -> None:
        if not self.account_id.isdigit():
            raise ValueError(f"account id must be digits, got {self.account_id!r}")
        if not self.stream_name or ":" in self.stream_name:
            raise ValueError(f"stream name must be non-empty without ':', got {self.stream_name!r}")
        if self.creation_epoch < 0:
            raise ValueError(f"creation epoch must be >= 0, got {self.creation_epoch}")

    @classmethod
    def parse(cls, serialized: str) -> StreamIdentifier:
        """Read ``account:stream:epoch`` (the value KCL stores in the ``streamName`` attribute)."""
        match = _STREAM_IDENTIFIER.fullmatch(serialized)
        if match is None:
            raise ValueError(f"not a stream identifier (account:stream:epoch): {serialized!r}")
        return cls(match["account"], match["name"], int(match["epoch"]))

    def __str__(self) -> str:
        return f"{self.account_id}:{self.stream_name}:{self.creation_epoch}"


def multi_stream_lease_key(stream: StreamIdentifier | str, shard_id: str) -> str:
    """The lease key KCL uses for ``shard_id`` of ``stream`` in multi-stream mode."""
    if not shard_id or ":" in shard_id:
        raise ValueError(f"shard id must be non-empty without ':', got {shard_id!r}")
    identifier = stream if isinstance(stream, StreamIdentifier) else StreamIdentifier.parse(stream)
    return f"{identifier}:{shard_id}"


def split_multi_stream_lease_key(lease_key: str) -> tuple[str, str]:
    """``(stream identifier, shard id)`` of a multi-stream lease key; ValueError for other keys."""
    stream, sep, shard_id = lease_key.rpartition(":")
    if not sep or not shard_id:
        raise ValueError(f"not a multi-stream lease key: {lease_key!r}")
    StreamIdentifier.parse(stream)  # validates the stream part
    return stream, shard_id


def is_multi_stream_lease_key(lease_key: str) -> bool:
    """Whether ``lease_key`` has the multi-stream shape ``account:stream:epoch:shard``."""
    try:
        split_multi_stream_lease_key(lease_key)
    except ValueError:
        return False
    return True
