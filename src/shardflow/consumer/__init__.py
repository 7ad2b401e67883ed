"""The consumer: reading shards and handing their records to user code.

Built in layers along the path of a record: ``fetch`` (getting batches of records from one
shard, by polling or enhanced fan-out), then deaggregation, dispatch to handlers, checkpointing
and lease coordination.
"""
