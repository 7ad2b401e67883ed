"""botocore's parameter validation, skipped for the requests shardflow builds itself.

Before serializing a request botocore walks its parameters against the operation's input
shape. For a request shardflow makes from its own typed values (an iterator the service
handed out, a lease write rendered from a :class:`~shardflow.leases.writes.LeaseWrite`)
that walk finds nothing, yet it is paid on every call: 2% of the CPU of an empty GetRecords
and 5% of a conditional lease UpdateItem (bench/client_calls.py, 5 rounds, within their
spread), the two calls an idle consumer makes most (one per idle shard every ``max_idle_time``; ~300 a second for 1,000
leases in the per-lease mode). :func:`validate_only_foreign_requests` keeps the walk for every
other operation (a producer's PutRecords, whose entries are the user's), where it turns a
wrong value into a ``ParamValidationError`` before anything is sent. The service still checks
every request it gets.

Only clients that carry shardflow's own requests alone skip it: those a consumer, a reader,
the multilang daemon and the Spark source open for fetching and for their lease table
(``ClientFactory.client(..., own_requests=True)``). A client of the public factory otherwise
validates every call, since its requests may carry user values (an idempotency guard's keys,
a Spark metadata store's items, the user's own calls).
"""

from __future__ import annotations

from typing import Any, Final

from botocore.validate import ParamValidationDecorator

OWN_REQUESTS: Final = frozenset(
    {
        # Kinesis: the polling fetcher's calls.
        "GetRecords",
        "GetShardIterator",
        # DynamoDB: the lease store's reads and conditional writes.
        "GetItem",
        "BatchGetItem",
        "Scan",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
    }
)
"""Operations whose parameters shardflow builds itself: sent unvalidated by its clients."""


class OwnRequestsUnvalidated:
    """A client's request serializer that validates every operation but ``skipped``."""

    def __init__(self, validated: ParamValidationDecorator, skipped: frozenset[str]) -> None:
        self._validated = validated
        # botocore keeps the serializer it decorates here (botocore.validate).
        self._plain: Any = validated._serializer
        self.skipped = skipped

    def serialize_to_request(self, parameters: Any, operation_model: Any) -> Any:
        if operation_model.name in self.skipped:
            return self._plain.serialize_to_request(parameters, operation_model)
        return self._validated.serialize_to_request(parameters, operation_model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._validated, name)


def validate_only_foreign_requests(client: Any, skipped: frozenset[str] = OWN_REQUESTS) -> bool:
    """Have ``client`` (botocore or aiobotocore) skip parameter validation for ``skipped``.
    False (nothing changed) when the client validates nothing already (its config said
    ``parameter_validation=False``) or keeps its serializer otherwise than botocore does."""
    serializer = getattr(client, "_serializer", None)
    if not isinstance(serializer, ParamValidationDecorator):
        return False
    if not hasattr(serializer, "_serializer"):
        return False
    client._serializer = OwnRequestsUnvalidated(serializer, skipped)
    return True
