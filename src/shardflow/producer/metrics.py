"""What a producer measures: counters plus HdrHistogram distributions, as mergeable snapshots.

Recording must cost little per record, so the hot path only bumps integers and counts values
in small dicts ("tallies"); values are folded into HdrHistograms when a snapshot is taken.
Large values are rounded to 10 significant bits first (at most 0.1 % off, like the
histograms' own 3 significant digits), which keeps each tally small.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from hdrh.histogram import HdrHistogram

# Histogram ranges: latency in milliseconds up to a day; sizes up to 64 MiB; counts up to 1e6.
_RANGES: Final[dict[str, int]] = {
    "latency_ms": 86_400_000,
    "attempts": 1_000_000,
    "record_bytes": 64 * 1024 * 1024,
    "request_bytes": 64 * 1024 * 1024,
    "request_records": 1_000_000,
    "records_per_kinesis_record": 1_000_000,
}
DISTRIBUTIONS: Final = tuple(_RANGES)
_SIGNIFICANT_FIGURES: Final = 3
_KEPT_BITS: Final = 10
SMALL_VALUES: Final = 1 << _KEPT_BITS
"""Values below this are tallied as they are (callers on hot paths may skip :func:`tally`)."""

Tally = dict[int, int]


def new_histogram(name: str) -> Any:
    """An empty HdrHistogram sized for the distribution ``name``."""
    return HdrHistogram(1, _RANGES[name], _SIGNIFICANT_FIGURES)


def tally(counts: Tally, value: int, count: int = 1) -> None:
    """Count ``value`` (rounded to 10 significant bits) ``count`` times."""
    if value >= SMALL_VALUES:
        shift = value.bit_length() - _KEPT_BITS
        value = (value >> shift) << shift
    counts[value] = counts.get(value, 0) + count


def _fold(counts: Tally, histograms: list[Any], name: str) -> None:
    top = _RANGES[name]
    for value, count in counts.items():
        for histogram in histograms:
            histogram.record_value(min(max(value, 0), top), count)
    counts.clear()


@dataclass(frozen=True, slots=True)
class ProducerMetricsSnapshot:
    """Counters and distributions of one producer (or several, merged) over a time window.

    ``started_at``/``ended_at`` are wall-clock seconds. Distributions are HdrHistograms
    (``hdrh.histogram.HdrHistogram``): ``latency_ms`` (put to result, per user record),
    ``attempts`` (per finished user record), ``record_bytes`` (per accepted user record),
    ``request_bytes`` and ``request_records`` (per PutRecords call), and
    ``records_per_kinesis_record`` (user records per Kinesis record: above 1 when aggregating).
    Treat them as read-only.
    """

    stream: str
    started_at: float
    ended_at: float
    records_put: int = 0
    records_succeeded: int = 0
    records_failed: int = 0
    bytes_succeeded: int = 0
    failures: Mapping[str, int] = field(default_factory=dict)
    """Failed user records by the error code they failed with."""
    put_records_calls: int = 0
    put_records_calls_failed: int = 0
    """Calls that failed as a whole (the records in them were retried or failed)."""
    entries_succeeded: int = 0
    entries_failed: int = 0
    entries_throttled: int = 0
    """Kinesis records (entries of PutRecords) refused with ProvisionedThroughputExceeded."""
    retries: int = 0
    """User records sent again after a failed attempt."""
    shard_map_refreshes: int = 0
    distributions: Mapping[str, Any] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return max(self.ended_at - self.started_at, 0.0)

    @property
    def throughput(self) -> float:
        """Records delivered per second over the window."""
        return self.records_succeeded / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def success_rate(self) -> float:
        """Delivered records over finished records (1.0 when nothing finished)."""
        finished = self.records_succeeded + self.records_failed
        return self.records_succeeded / finished if finished else 1.0

    def distribution(self, name: str) -> Any:
        """The HdrHistogram ``name`` (one of :data:`DISTRIBUTIONS`)."""
        return self.distributions[name]

    def percentile(self, name: str, percentile: float) -> int:
        """The value at ``percentile`` (0-100) of a distribution; 0 if it is empty."""
        histogram = self.distributions[name]
        return int(histogram.get_value_at_percentile(percentile)) if histogram.total_count else 0

    def merge(self, other: ProducerMetricsSnapshot) -> ProducerMetricsSnapshot:
        """A snapshot covering both (counters added, distributions combined, window spanned)."""
        failures = dict(self.failures)
        for code, count in other.failures.items():
            failures[code] = failures.get(code, 0) + count
        distributions = {}
        for name in DISTRIBUTIONS:
            combined = new_histogram(name)
            for source in (self, other):
                if name in source.distributions:
                    combined.add(source.distributions[name])
            distributions[name] = combined
        return ProducerMetricsSnapshot(
            stream=self.stream if self.stream == other.stream else "*",
            started_at=min(self.started_at, other.started_at),
            ended_at=max(self.ended_at, other.ended_at),
            records_put=self.records_put + other.records_put,
            records_succeeded=self.records_succeeded + other.records_succeeded,
            records_failed=self.records_failed + other.records_failed,
            bytes_succeeded=self.bytes_succeeded + other.bytes_succeeded,
            failures=MappingProxyType(failures),
            put_records_calls=self.put_records_calls + other.put_records_calls,
            put_records_calls_failed=self.put_records_calls_failed + other.put_records_calls_failed,
            entries_succeeded=self.entries_succeeded + other.entries_succeeded,
            entries_failed=self.entries_failed + other.entries_failed,
            entries_throttled=self.entries_throttled + other.entries_throttled,
            retries=self.retries + other.retries,
            shard_map_refreshes=self.shard_map_refreshes + other.shard_map_refreshes,
            distributions=MappingProxyType(distributions),
        )

    def summary(self) -> dict[str, float | int | str]:
        """A flat view for logs and dashboards."""
        return {
            "stream": self.stream,
            "elapsed_s": round(self.elapsed, 3),
            "records_put": self.records_put,
            "records_succeeded": self.records_succeeded,
            "records_failed": self.records_failed,
            "throughput_rps": round(self.throughput, 1),
            "success_rate": round(self.success_rate, 6),
            "latency_p50_ms": self.percentile("latency_ms", 50),
            "latency_p99_ms": self.percentile("latency_ms", 99),
            "latency_max_ms": self.percentile("latency_ms", 100),
            "attempts_max": self.percentile("attempts", 100),
            "put_records_calls": self.put_records_calls,
            "put_records_calls_failed": self.put_records_calls_failed,
            "entries_throttled": self.entries_throttled,
            "retries": self.retries,
        }


_COUNTERS: Final = (
    "records_put",
    "records_succeeded",
    "records_failed",
    "bytes_succeeded",
    "put_records_calls",
    "put_records_calls_failed",
    "entries_succeeded",
    "entries_failed",
    "entries_throttled",
    "retries",
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
        self.tallies: dict[str, Tally] = {name: {} for name in DISTRIBUTIONS}
        self._total = {name: new_histogram(name) for name in DISTRIBUTIONS}
        self._interval = {name: new_histogram(name) for name in DISTRIBUTIONS}
        self._started_at = wall()
        self._interval_started_at = self._started_at
        self._interval_base: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._interval_failures: dict[str, int] = {}
        self._interval_refreshes = 0

    def failed(self, code: str) -> None:
        self.records_failed += 1
        self.failures[code] = self.failures.get(code, 0) + 1

    def snapshot(self) -> ProducerMetricsSnapshot:
        """Everything since the producer started."""
        self._fold()
        return self._make(
            self._started_at,
            {name: getattr(self, name) for name in _COUNTERS},
            dict(self.failures),
            self._refreshes(),
            self._total,
        )

    def interval_snapshot(self) -> ProducerMetricsSnapshot:
        """Everything since the previous interval snapshot (or the start); starts a new interval."""
        self._fold()
        now_counters = {name: getattr(self, name) for name in _COUNTERS}
        counters = {name: now_counters[name] - self._interval_base[name] for name in _COUNTERS}
        failures = {
            code: count - self._interval_failures.get(code, 0)
            for code, count in self.failures.items()
            if count != self._interval_failures.get(code, 0)
        }
        refreshes = self._refreshes()
        snapshot = self._make(
            self._interval_started_at,
            counters,
            failures,
            refreshes - self._interval_refreshes,
            self._interval,
        )
        self._interval_started_at = snapshot.ended_at
        self._interval_base = now_counters
        self._interval_failures = dict(self.failures)
        self._interval_refreshes = refreshes
        self._interval = {name: new_histogram(name) for name in DISTRIBUTIONS}
        return snapshot

    def _fold(self) -> None:
        for name, counts in self.tallies.items():
            if counts:
                _fold(counts, [self._total[name], self._interval[name]], name)

    def _make(
        self,
        started_at: float,
        counters: dict[str, int],
        failures: dict[str, int],
        refreshes: int,
        histograms: dict[str, Any],
    ) -> ProducerMetricsSnapshot:
        copies = {}
        for name, histogram in histograms.items():
            copy = new_histogram(name)
            copy.add(histogram)
            copies[name] = copy
        return ProducerMetricsSnapshot(
            stream=self.stream,
            started_at=started_at,
            ended_at=self._wall(),
            failures=MappingProxyType(failures),
            shard_map_refreshes=refreshes,
            distributions=MappingProxyType(copies),
            **counters,
        )
