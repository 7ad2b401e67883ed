"""Helpers shared by several test modules (importable as ``support.*``: ``tests`` is on the path).

- :mod:`support.streams`: Kinesis through shardflow's async clients (create, write).
- :mod:`support.boto`: Kinesis and DynamoDB through plain boto3 (create, write, read back).
- :mod:`support.waiting`: bounded waits for what other tasks make true.
- :mod:`support.clocks`: a clock whose sleeps pass instantly.
- :mod:`support.lease_backends`: one fresh lease table per test, on DynamoDB or in memory.
- :mod:`support.lease_steps`: the lease-history state machine of the unit and replay tests.
- :mod:`support.coordinator_fakes`: fakes and time control for lease-coordinator unit tests.
"""
