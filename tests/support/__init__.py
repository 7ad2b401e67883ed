"""Helpers shared by several test modules (importable as ``support.*``: ``tests`` is on the path).

- :mod:`support.lease_backends`: one fresh lease table per test, on DynamoDB or in memory.
- :mod:`support.lease_steps`: the lease-history state machine of the unit and replay tests.
- :mod:`support.coordinator_fakes`: fakes and time control for lease-coordinator unit tests.
"""
