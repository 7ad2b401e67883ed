"""The KPL aggregation format: many user records packed into one Kinesis record.

Format: ``MAGIC`` (4 bytes), a protobuf ``AggregatedRecord`` (tables of partition keys and
explicit hash keys, then the user records referring to them by index), and the MD5 of the
protobuf bytes. Compatible both ways with the KPL, the KCL and ``aws-kinesis-agg``.
"""

from shardflow.aggregation._format import MAGIC, MAX_RECORD_BYTES, is_aggregated
from shardflow.aggregation.decode import MalformedPolicy, deaggregate, log_malformed
from shardflow.aggregation.encode import AggregateBuilder, AggregatedRecord, aggregate
from shardflow.aggregation.unpack import Unpacking

__all__ = [
    "MAGIC",
    "MAX_RECORD_BYTES",
    "AggregateBuilder",
    "AggregatedRecord",
    "MalformedPolicy",
    "Unpacking",
    "aggregate",
    "deaggregate",
    "is_aggregated",
    "log_malformed",
]
