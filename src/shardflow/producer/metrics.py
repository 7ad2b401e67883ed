"""The producer's live metrics: counters and distributions kept on its event loop.

The snapshot type, the histogram and the Prometheus collector are shared with the consumer in
:mod:`shardflow.metrics`. Counters are plain ints named as the fields of
:class:`~shardflow.metrics.ProducerMetricsSnapshot`; each distribution is a :class:`Tally`
(one dict update per value; the hottest loops write its ``counts`` directly) that becomes a
:class:`~shardflow.metrics.Histogram` when a snapshot is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import MappingProxyType

from shardflow.metrics.recording import BYTES, COUNT, SECONDS, Tally
from shardflow.metrics.snapshots import (
    COUNTERS,
    DISTRIBUTIONS,
    ProducerMetricsSnapshot,
    copy_fields,
)


class MetricsRecorder:
    """The producer's live counters and tallies; hands out cumulative and interval snapshots.

    The producer updates the public counters and tallies directly (it runs on one event loop
    thread); snapshots must be taken on that thread too.
    """

    def __init__(
        self,
        stream: str,
        *,
        wall: Callable[[], float] = time.time,
        refreshes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.stream = stream
        self._wall = wall
        self._refreshes = refreshes
        self.records_put = 0
        self.records_succeeded = 0
        self.records_failed = 0
        self.bytes_succeeded = 0
        self.failures: dict[str, int] = {}
        self.put_records_calls = 0
        self.put_records_calls_failed = 0
        self.entries_succeeded = 0
        self.entries_failed = 0
        self.entries_throttled = 0
        self.retries = 0
        self.latency = Tally(SECONDS, interval=True)
        """Seconds from put to result, per delivered user record."""
        self.attempts = Tally(COUNT, interval=True)
        self.record_bytes = Tally(BYTES, interval=True)
        self.request_bytes = Tally(BYTES, interval=True)
        self.request_records = Tally(COUNT, interval=True)
        self.records_per_kinesis_record = Tally(COUNT, interval=True)
        # For CloudWatch (the KPL's metrics), not in snapshots: a value per request or per
        # failed Kinesis record, never per delivered record.
        self.errors_by_code: dict[str, int] = {}
        """Kinesis records refused, by error code, every attempt (a failed call: each record
        of it)."""
        self.request_time = Tally(SECONDS)
        """Seconds of each PutRecords call."""
        self.user_records_per_request = Tally(COUNT)
        self._started_at = wall()
        self._intervals: dict[str, _IntervalBase] = {"": _IntervalBase(self._started_at)}

    def failed(self, code: str) -> None:
        self.records_failed += 1
        self.failures[code] = self.failures.get(code, 0) + 1

    def snapshot(self) -> ProducerMetricsSnapshot:
        """Everything since the producer started."""
        distributions = {name: getattr(self, name).snapshot() for name in DISTRIBUTIONS}
        return copy_fields(
            self,
            ProducerMetricsSnapshot,
            started_at=self._started_at,
            ended_at=self._wall(),
            failures=MappingProxyType(dict(self.failures)),
            shard_map_refreshes=self._refreshes(),
            **distributions,
        )

    def open_interval(self, reader: str) -> None:
        """Start intervals for another reader (values from now on): CloudWatch's publisher
        and the ``on_metrics`` callback each see every value once."""
        for name in DISTRIBUTIONS:
            getattr(self, name).open_interval(reader)
        base = _IntervalBase(self._wall())
        base.counters = {name: getattr(self, name) for name in COUNTERS}
        base.failures = dict(self.failures)
        base.refreshes = self._refreshes()
        self._intervals[reader] = base

    def interval_snapshot(self, reader: str = "") -> ProducerMetricsSnapshot:
        """Everything since ``reader``'s previous interval snapshot (or its start); starts its
        next interval."""
        base = self._intervals[reader]
        distributions = {
            name: getattr(self, name).interval_snapshot(reader) for name in DISTRIBUTIONS
        }
        now = {name: getattr(self, name) for name in COUNTERS}
        failures = {
            code: count - base.failures.get(code, 0)
            for code, count in self.failures.items()
            if count != base.failures.get(code, 0)
        }
        refreshes = self._refreshes()
        snapshot = copy_fields(
            self,
            ProducerMetricsSnapshot,
            started_at=base.started_at,
            ended_at=self._wall(),
            failures=MappingProxyType(failures),
            shard_map_refreshes=refreshes - base.refreshes,
            **{name: now[name] - base.counters.get(name, 0) for name in COUNTERS},
            **distributions,
        )
        base.started_at = snapshot.ended_at
        base.counters = now
        base.failures = dict(self.failures)
        base.refreshes = refreshes
        return snapshot


class _IntervalBase:
    """Where one reader's current interval starts: the time, and the counters then."""

    __slots__ = ("counters", "failures", "refreshes", "started_at")

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.counters: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.refreshes = 0
