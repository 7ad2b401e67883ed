"""Which stream a lease belongs to, and lease keys of shards in the same stream.

One stream: lease keys are plain shard ids (KCL single-stream tables). Several streams (or an
explicit stream identifier): keys are ``<account:stream:epoch>:<shard id>`` with the stream
identifier in ``streamName`` (KCL multi-stream tables). Leases of other streams in the table
are not ours and are left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from shardflow.leases.keys import multi_stream_lease_key
from shardflow.leases.model import Lease
from shardflow.leases.settings import StreamSpec
from shardflow.leases.shard_sync import resolve_stream_identifier


class StreamSet:
    """The streams one coordinator leases, and how their leases are keyed."""

    def __init__(self, streams: Sequence[StreamSpec | str]) -> None:
        specs = [StreamSpec(s) if isinstance(s, str) else s for s in streams]
        if not specs:
            raise ValueError("a coordinator needs at least one stream")
        if len({spec.name for spec in specs}) != len(specs):
            raise ValueError("a stream is listed twice")
        self._specs = specs
        self.multi_stream = len(specs) > 1 or any(s.identifier is not None for s in specs)
        self._by_identifier: dict[str, StreamSpec] = {}
        self._resolved = not self.multi_stream

    @property
    def specs(self) -> list[StreamSpec]:
        return list(self._specs)

    async def resolve(self, kinesis: Any) -> None:
        """Look up missing multi-stream identifiers (DescribeStreamSummary); once."""
        if self._resolved:
            return
        resolved = []
        for spec in self._specs:
            if spec.identifier is None:
                identifier = await resolve_stream_identifier(kinesis, spec.name)
                spec = StreamSpec(spec.name, identifier, spec.initial_position)
            resolved.append(spec)
        self._specs = resolved
        self._by_identifier = {str(spec.identifier): spec for spec in resolved}
        self._resolved = True

    def identifier_of(self, spec: StreamSpec) -> str | None:
        """The key prefix of ``spec``'s leases (None in single-stream mode)."""
        if not self.multi_stream or spec.identifier is None:
            return None
        return str(spec.identifier)

    def spec_of(self, lease: Lease) -> StreamSpec | None:
        """The stream ``lease`` belongs to; None for leases of streams not leased here."""
        if not self.multi_stream:
            return self._specs[0] if lease.stream_name is None else None
        if lease.stream_name is None:
            return None
        return self._by_identifier.get(lease.stream_name)

    def ours(self, leases: Iterable[Lease]) -> list[Lease]:
        return [lease for lease in leases if self.spec_of(lease) is not None]

    def leases_of(self, spec: StreamSpec, leases: Iterable[Lease]) -> list[Lease]:
        return [lease for lease in leases if self.spec_of(lease) is spec]

    @staticmethod
    def key_for(lease: Lease, shard_id: str) -> str:
        """The lease key of ``shard_id`` in the same stream as ``lease``."""
        if lease.stream_name is None:
            return shard_id
        return multi_stream_lease_key(lease.stream_name, shard_id)
