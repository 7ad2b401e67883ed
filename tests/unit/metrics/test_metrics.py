"""shardflow.metrics: the one histogram type, live tallies, snapshots taken on a loop, and the
Prometheus names dashboards depend on."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shardflow.clock import ManualClock
from shardflow.consumer.metrics import ConsumerMetrics, ShardGauges
from shardflow.events import CheckpointWritten, EventEmitter, FetchThrottled
from shardflow.metrics import (
    LATENCY_BUCKETS,
    ConsumerCollector,
    ConsumerMetricsSnapshot,
    Histogram,
    ProducerCollector,
    ProducerMetricsSnapshot,
    StreamMetrics,
)
from shardflow.metrics.prometheus import PRODUCER_METRICS, SHARD_METRICS, STREAM_METRICS
from shardflow.metrics.recording import BYTES, SECONDS, RateMeter, Tally, on_loop, rounded
from shardflow.producer.metrics import MetricsRecorder

ROOT = Path(__file__).resolve().parents[3]

# What dashboards scrape today: a name leaving this list breaks someone's dashboard.
CONSUMER_SAMPLES = {
    "shardflow_consumer_records_total",
    "shardflow_consumer_bytes_total",
    "shardflow_consumer_checkpoints_total",
    "shardflow_consumer_shard_failures_total",
    "shardflow_consumer_handler_overruns_total",
    "shardflow_consumer_dead_letters_total",
    "shardflow_consumer_fetch_throttles_total",
    "shardflow_consumer_subscription_renewals_total",
    "shardflow_consumer_out_of_range_sub_records_total",
    "shardflow_consumer_records_per_second",
    "shardflow_consumer_parked_shards",
    "shardflow_consumer_overrunning_shards",
    "shardflow_consumer_owned_shards",
    "shardflow_consumer_handler_latency_seconds_bucket",
    "shardflow_consumer_handler_latency_seconds_count",
    "shardflow_consumer_handler_latency_seconds_sum",
    "shardflow_consumer_millis_behind_latest",
    "shardflow_consumer_checkpoint_age_seconds",
    "shardflow_consumer_checkpoint_lag_records",
    "shardflow_consumer_unacked_records",
    "shardflow_consumer_prefetch_records",
    "shardflow_consumer_prefetch_bytes",
}
PRODUCER_SAMPLES = {
    "shardflow_producer_records_put_total",
    "shardflow_producer_records_succeeded_total",
    "shardflow_producer_bytes_succeeded_total",
    "shardflow_producer_records_failed_total",
    "shardflow_producer_put_records_calls_total",
    "shardflow_producer_put_records_calls_failed_total",
    "shardflow_producer_put_records_entries_total",
    "shardflow_producer_retries_total",
    "shardflow_producer_shard_map_refreshes_total",
    *(
        f"shardflow_producer_{name}_{part}"
        for name in (
            "record_latency_seconds",
            "record_attempts",
            "record_size_bytes",
            "request_size_bytes",
        )
        for part in ("bucket", "count", "sum")
    ),
}


def samples(registry: CollectorRegistry) -> set[str]:
    return {sample.name for family in registry.collect() for sample in family.samples}


# --- the histogram -----------------------------------------------------------------------------


@given(st.floats(min_value=0.0, max_value=86_400.0))
def test_a_duration_is_kept_to_a_microsecond_or_a_tenth_of_a_percent(seconds: float) -> None:
    tally = Tally(SECONDS)
    tally.add(seconds)
    histogram = tally.snapshot()
    assert histogram.count == 1
    error = abs(histogram.max - seconds)
    assert error <= max(1e-6, seconds * 0.001)
    assert abs(histogram.sum - seconds) <= max(1e-6, seconds * 0.001)


@pytest.mark.parametrize(
    "value", [0, 1, 2_047, 2_048, 2_049, 4_097, 5_000, 123_456, 1_048_577, 9_999_999, 2**40 + 2**30]
)
def test_rounding_keeps_values_within_a_tenth_of_a_percent(value: int) -> None:
    kept = rounded(value)
    assert kept <= value
    assert value - kept <= value * 0.001


def test_handler_latencies_land_in_the_buckets_of_their_seconds() -> None:
    metrics = ConsumerMetrics()
    metrics.handler_latencies("s", [0.0003, 0.0005, 0.002, 0.7])
    metrics.handler_latencies("s", [0.0000004])  # under a microsecond: counted as 0
    histogram = metrics.snapshot().streams["s"].handler_latency
    assert histogram.count == 5
    assert histogram.sum == pytest.approx(0.7028, rel=1e-3)
    assert histogram.cumulative_counts([0.0, 0.0005, 0.001, 0.0025, 0.5, 1.0]) == [1, 3, 3, 4, 4, 5]
    assert histogram.percentile(50) == pytest.approx(0.0005)
    assert histogram.percentile(100) == pytest.approx(0.7, rel=1e-3)
    assert histogram.min == 0.0


def test_longer_than_a_day_counts_as_a_day() -> None:
    tally = Tally(SECONDS)
    tally.add(3 * 86_400.0)
    assert tally.snapshot().max == pytest.approx(86_400.0, rel=1e-3)


def test_histograms_merge_into_a_new_one_and_only_of_one_scale() -> None:
    first, second = Tally(SECONDS), Tally(SECONDS)
    first.add_all([0.001, 0.002])
    second.add(0.004)
    a, b = first.snapshot(), second.snapshot()
    merged = a.merge(b)
    assert (merged.count, a.count, b.count) == (3, 2, 1)
    assert merged.sum == pytest.approx(0.007)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(Tally(BYTES).snapshot())


def test_a_snapshot_does_not_change_when_recording_goes_on() -> None:
    tally = Tally(SECONDS, interval=True)
    tally.add(0.010)
    taken = tally.snapshot()
    tally.add(0.020)
    assert taken.count == 1
    assert tally.snapshot().count == 2
    assert tally.interval_snapshot().count == 2
    assert tally.interval_snapshot().count == 0


def test_an_empty_histogram_answers_zero() -> None:
    empty = Histogram()
    assert (empty.count, empty.sum, empty.mean, empty.max, empty.percentile(99)) == (0, 0, 0, 0, 0)
    assert empty.cumulative_counts(LATENCY_BUCKETS) == [0] * len(LATENCY_BUCKETS)


class SteppedClock(ManualClock):
    def step_to(self, now: float) -> None:
        self._now = now


def test_the_rate_is_over_the_last_ten_seconds() -> None:
    clock = SteppedClock(start=100.0)
    meter = RateMeter(clock)
    meter.add(50)
    clock.step_to(105.0)
    meter.add(50)
    assert meter.rate() == pytest.approx(10.0)
    clock.step_to(111.0)
    assert meter.rate() == pytest.approx(5.0)


# --- snapshots from any thread -----------------------------------------------------------------


def test_a_snapshot_from_another_thread_is_taken_on_the_loop() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert on_loop(loop, threading.get_ident, 5.0) == thread.ident
        loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop is busy
        with pytest.raises(TimeoutError):
            on_loop(loop, threading.get_ident, 0.05)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    # A loop that no longer runs records nothing: read here.
    assert on_loop(loop, threading.get_ident, 0.05) == threading.get_ident()


def test_a_collector_leaves_out_a_source_that_does_not_answer() -> None:
    class Busy:
        def metrics(self, timeout: float = 5.0) -> ConsumerMetricsSnapshot:
            raise TimeoutError("busy")

    metrics = ConsumerMetrics()
    metrics.records_handled("s", 3, 30)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(Busy(), metrics.snapshot))
    assert registry.get_sample_value("shardflow_consumer_records_total", {"stream": "s"}) == 3


# --- the names dashboards depend on ------------------------------------------------------------


def test_every_consumer_metric_name_of_before_is_still_exported() -> None:
    clock = ManualClock(start=5.0)
    metrics = ConsumerMetrics(clock)
    emitter = EventEmitter("w1", clock=clock, subscribers=[metrics.observe]).for_shard("s", "a")
    emitter.emit(FetchThrottled, operation="GetRecords", delay=0.1)
    emitter.emit(CheckpointWritten, position=None, records=1, reason="periodic")
    metrics.records_handled("s", 4, 40)
    metrics.handler_latencies("s", [0.01, 0.02])
    metrics.track_shard("s", "shardId-0", lambda: ShardGauges(250, 1.5, 2, 3, 4, 5))
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(metrics.snapshot))
    assert samples(registry) == CONSUMER_SAMPLES
    value = registry.get_sample_value
    labels = {"stream": "s", "shard": "shardId-0"}
    assert value("shardflow_consumer_millis_behind_latest", labels) == 250
    assert value("shardflow_consumer_checkpoint_age_seconds", labels) == 1.5
    assert value("shardflow_consumer_owned_shards", {"stream": "s"}) == 1
    assert value("shardflow_consumer_checkpoints_total", {"stream": "s"}) == 1
    assert value("shardflow_consumer_handler_latency_seconds_count", {"stream": "s"}) == 2
    assert (
        value("shardflow_consumer_handler_latency_seconds_bucket", {"stream": "s", "le": "0.01"})
        == 1
    )
    assert (
        value(
            "shardflow_consumer_out_of_range_sub_records_total",
            {"stream": "s", "action": "dropped"},
        )
        == 0
    )


def test_every_producer_metric_name_of_before_is_still_exported() -> None:
    recorder = MetricsRecorder("orders")
    recorder.failed("InternalFailure")
    recorder.latency.add(0.01)
    registry = CollectorRegistry()
    registry.register(ProducerCollector(recorder.snapshot))
    assert samples(registry) == PRODUCER_SAMPLES


def test_both_latency_histograms_have_the_same_buckets_in_seconds() -> None:
    consumer = ConsumerMetrics()
    consumer.handler_latencies("s", [0.05])
    recorder = MetricsRecorder("s")
    recorder.latency.add(0.05)
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(consumer.snapshot))
    registry.register(ProducerCollector(recorder.snapshot))
    bounds = {
        name: [s.labels["le"] for f in registry.collect() for s in f.samples if s.name == name]
        for name in (
            "shardflow_consumer_handler_latency_seconds_bucket",
            "shardflow_producer_record_latency_seconds_bucket",
        )
    }
    expected = [f"{b:g}" for b in LATENCY_BUCKETS] + ["+Inf"]
    assert list(bounds.values()) == [expected, expected]


def test_the_operations_guide_lists_every_exported_name() -> None:
    guide = (ROOT / "docs" / "guides" / "operations.md").read_text()
    listed = set(re.findall(r"`(shardflow_(?:consumer|producer)_\w+)`", guide))
    exported = {f"shardflow_consumer_{m.name}" for m in (*STREAM_METRICS, *SHARD_METRICS)} | {
        f"shardflow_producer_{m.name}" for m in PRODUCER_METRICS
    }
    counters = {f"shardflow_consumer_{m.name}" for m in STREAM_METRICS if m.kind == "counter"} | {
        f"shardflow_producer_{m.name}" for m in PRODUCER_METRICS if m.kind == "counter"
    }
    shown = {
        name.removesuffix("_total") if name[: -len("_total")] in counters else name
        for name in listed
    }
    assert shown == exported


def test_the_old_consumer_snapshot_names_work_for_a_release_with_a_warning() -> None:
    import shardflow.consumer.metrics as old_home

    with pytest.warns(DeprecationWarning, match="ConsumerMetricsSnapshot"):
        assert old_home.MetricsSnapshot is ConsumerMetricsSnapshot
    with pytest.warns(DeprecationWarning, match="StreamMetrics"):
        assert old_home.StreamCounters is StreamMetrics
    assert "StreamCounters" in (ROOT / "CHANGELOG.md").read_text()


def test_snapshots_are_frozen() -> None:
    snapshot = ProducerMetricsSnapshot(stream="s", started_at=0.0, ended_at=1.0)
    with pytest.raises(AttributeError):
        snapshot.records_put = 3  # type: ignore[misc]
