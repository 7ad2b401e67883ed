"""Producer metrics: the recorder's snapshots and intervals, merging, and the collector."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from shardflow.metrics import Histogram, ProducerCollector, ProducerMetricsSnapshot
from shardflow.metrics.snapshots import DISTRIBUTIONS
from shardflow.producer.metrics import MetricsRecorder


class FakeWall:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorder_with(
    wall: FakeWall, *, succeeded: int, failed: int, latency: float, stream: str = "s"
) -> MetricsRecorder:
    recorder = MetricsRecorder(stream, wall=wall)
    recorder.records_put += succeeded + failed
    recorder.records_succeeded += succeeded
    for _ in range(failed):
        recorder.failed("ProvisionedThroughputExceededException")
    recorder.latency.add(latency, succeeded)
    recorder.attempts.add(1, succeeded)
    recorder.put_records_calls += 2
    return recorder


def test_snapshot_holds_counters_and_distributions() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=90, failed=10, latency=0.040)
    wall.now += 10
    snapshot = recorder.snapshot()
    assert snapshot.records_put == 100
    assert snapshot.records_succeeded == 90
    assert snapshot.failures == {"ProvisionedThroughputExceededException": 10}
    assert snapshot.success_rate == pytest.approx(0.9)
    assert snapshot.throughput == pytest.approx(9.0)
    assert snapshot.latency.percentile(50) == pytest.approx(0.040, rel=1e-3)
    assert snapshot.latency.sum == pytest.approx(90 * 0.040, rel=1e-3)
    assert snapshot.attempts.count == 90
    assert set(snapshot.distributions) == set(DISTRIBUTIONS)
    assert all(isinstance(h, Histogram) for h in snapshot.distributions.values())


def test_the_old_latency_ms_name_still_answers_in_milliseconds_with_a_warning() -> None:
    snapshot = recorder_with(FakeWall(), succeeded=3, failed=0, latency=0.040).snapshot()
    with pytest.warns(DeprecationWarning, match="latency_ms"):
        assert snapshot.percentile("latency_ms", 50) == pytest.approx(40, rel=1e-3)


def test_interval_snapshots_cover_only_their_interval() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=5, failed=1, latency=0.010)
    wall.now += 1
    first = recorder.interval_snapshot()
    assert (first.records_succeeded, first.records_failed, first.elapsed) == (5, 1, 1.0)
    assert first.latency.count == 5

    recorder.records_succeeded += 7
    recorder.latency.add(0.300, 7)
    wall.now += 2
    second = recorder.interval_snapshot()
    assert second.records_succeeded == 7
    assert second.records_failed == 0
    assert dict(second.failures) == {}
    assert second.elapsed == 2.0
    assert second.latency.count == 7
    assert second.latency.percentile(1) == pytest.approx(0.300, rel=1e-3)
    # the cumulative view still has everything
    total = recorder.snapshot()
    assert total.records_succeeded == 12
    assert total.latency.count == 12


def test_merge_adds_counters_combines_distributions_and_spans_windows() -> None:
    wall_a, wall_b = FakeWall(100.0), FakeWall(105.0)
    a = recorder_with(wall_a, succeeded=10, failed=2, latency=0.020, stream="one")
    b = recorder_with(wall_b, succeeded=30, failed=0, latency=0.500, stream="two")
    wall_a.now, wall_b.now = 110.0, 120.0
    merged = a.snapshot().merge(b.snapshot())
    assert merged.stream == "*"
    assert (merged.started_at, merged.ended_at) == (100.0, 120.0)
    assert merged.records_succeeded == 40
    assert merged.records_failed == 2
    assert merged.put_records_calls == 4
    assert merged.failures == {"ProvisionedThroughputExceededException": 2}
    assert merged.latency.count == 40
    assert merged.latency.percentile(25) == pytest.approx(0.020, rel=1e-3)
    assert merged.latency.max == pytest.approx(0.500, rel=1e-3)
    assert merged.throughput == pytest.approx(40 / 20)


def test_merge_is_associative_for_counters_and_keeps_inputs_untouched() -> None:
    snapshots = [
        recorder_with(FakeWall(), succeeded=n, failed=1, latency=n / 1000).snapshot()
        for n in (1, 2, 3)
    ]
    left = snapshots[0].merge(snapshots[1]).merge(snapshots[2])
    right = snapshots[0].merge(snapshots[1].merge(snapshots[2]))
    assert left.records_succeeded == right.records_succeeded == 6
    assert left.failures == right.failures
    assert left.latency.count == right.latency.count == 6
    assert snapshots[0].latency.count == 1


def test_empty_snapshot_has_sane_derived_values() -> None:
    empty = ProducerMetricsSnapshot(stream="s", started_at=5.0, ended_at=5.0)
    assert empty.throughput == 0.0
    assert empty.success_rate == 1.0
    merged = empty.merge(empty)
    assert merged.latency.percentile(99) == 0
    assert merged.summary()["records_put"] == 0
    assert merged.summary()["latency_p99_ms"] == 0


def test_prometheus_collector_exports_counters_and_histograms() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=8, failed=2, latency=0.030, stream="orders")
    recorder.latency.add(0.700, 2)
    registry = CollectorRegistry()
    registry.register(ProducerCollector(recorder.snapshot, recorder.snapshot))
    text = generate_latest(registry).decode()
    # two sources of the same stream are merged
    assert 'shardflow_producer_records_succeeded_total{stream="orders"} 16.0' in text
    assert (
        'shardflow_producer_records_failed_total{code="ProvisionedThroughputExceededException",'
        'stream="orders"} 4.0'
    ) in text
    # seconds, as before the histograms moved to one design
    assert (
        'shardflow_producer_record_latency_seconds_bucket{le="0.025",stream="orders"} 0.0' in text
    )
    assert (
        'shardflow_producer_record_latency_seconds_bucket{le="0.05",stream="orders"} 16.0' in text
    )
    assert 'shardflow_producer_record_latency_seconds_bucket{le="1",stream="orders"} 20.0' in text
    assert 'shardflow_producer_record_latency_seconds_count{stream="orders"} 20.0' in text
    assert registry.get_sample_value(
        "shardflow_producer_record_latency_seconds_sum", {"stream": "orders"}
    ) == pytest.approx(16 * 0.030 + 4 * 0.700, rel=1e-3)
    assert 'shardflow_producer_put_records_calls_total{stream="orders"} 4.0' in text
