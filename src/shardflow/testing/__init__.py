"""Helpers for testing code that uses shardflow (and shardflow itself) without AWS.

For your consumer's unit tests: :class:`MemoryKinesis` (streams in memory, answering like a
Kinesis client) and :func:`consume_until_caught_up` (the real consumer against it and an
in-memory lease table, until every record is handled; then inspect the checkpoints), with
:func:`fast_settings` and :func:`partition_key_in`; :class:`InMemoryDeadLetters` keeps dead
letters in a list. :mod:`shardflow.testing.faults` injects
AWS failures in front of an emulator; :class:`LeaseTableBrownout` makes the in-memory lease
table answer errors for a while (its ``fault`` hook).
"""

from shardflow.testing.brownout import LeaseTableBrownout
from shardflow.testing.dead_letters import InMemoryDeadLetters
from shardflow.testing.harness import (
    FAST_LEASES,
    ConsumeReport,
    consume_until_caught_up,
    fast_settings,
)
from shardflow.testing.memory import MemoryKinesis, partition_key_in

__all__ = [
    "FAST_LEASES",
    "ConsumeReport",
    "InMemoryDeadLetters",
    "LeaseTableBrownout",
    "MemoryKinesis",
    "consume_until_caught_up",
    "fast_settings",
    "partition_key_in",
]
