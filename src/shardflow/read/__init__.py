"""The read core: what every reader of a shard shares, the consumer and the Spark source alike.

- :mod:`~shardflow.read.intake`: the intake rules, in order: de-aggregation (KPL aggregates into
  user records, incrementally), the resume filter (records a checkpoint covers, records the
  stored completed-record state lists as handled), and the hash-range rule for sub-records
  (:class:`~shardflow.read.intake.HashRangeRule`: re-sent out-of-range copies skipped). The
  consumer applies them per record (:class:`~shardflow.read.intake.RecordIntake`); the Spark
  source per column of a chunk of rows, through the same rule objects.
- :mod:`~shardflow.read.completed`: records handled beyond a checkpoint, kept next to it.
- Positions are :mod:`shardflow.positions` (:class:`~shardflow.positions.ShardPosition`).
"""
