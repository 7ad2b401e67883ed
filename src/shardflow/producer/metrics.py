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
        self._started_at = wall()
        self._interval_started_at = self._started_at
        self._interval_base: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._interval_failures: dict[str, int] = {}
        self._interval_refreshes = 0

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

    def interval_snapshot(self) -> ProducerMetricsSnapshot:
        """Everything since the previous interval snapshot (or the start); starts a new interval."""
        distributions = {name: getattr(self, name).interval_snapshot() for name in DISTRIBUTIONS}
        now = {name: getattr(self, name) for name in COUNTERS}
        failures = {
            code: count - self._interval_failures.get(code, 0)
            for code, count in self.failures.items()
            if count != self._interval_failures.get(code, 0)
        }
        refreshes = self._refreshes()
        snapshot = copy_fields(
            self,
            ProducerMetricsSnapshot,
            started_at=self._interval_started_at,
            ended_at=self._wall(),
            failures=MappingProxyType(failures),
            shard_map_refreshes=refreshes - self._interval_refreshes,
            **{name: now[name] - self._interval_base[name] for name in COUNTERS},
            **distributions,
        )
        self._interval_started_at = snapshot.ended_at
        self._interval_base = now
        self._interval_failures = dict(self.failures)
        self._interval_refreshes = refreshes
        return snapshot
