"""Producer metrics: tallies, snapshots, merging and the prometheus-client collector."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from shardflow.producer import ProducerCollector, ProducerMetricsSnapshot
from shardflow.producer.metrics import DISTRIBUTIONS, MetricsRecorder, tally


class FakeWall:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorder_with(
    wall: FakeWall, *, succeeded: int, failed: int, latency_ms: int, stream: str = "s"
) -> MetricsRecorder:
    recorder = MetricsRecorder(stream, wall=wall)
    recorder.records_put += succeeded + failed
    recorder.records_succeeded += succeeded
    for _ in range(failed):
        recorder.failed("ProvisionedThroughputExceededException")
    tally(recorder.tallies["latency_ms"], latency_ms, succeeded)
    tally(recorder.tallies["attempts"], 1, succeeded)
    recorder.put_records_calls += 2
    return recorder


@pytest.mark.parametrize("value", [0, 1, 999, 1_023, 1_024, 5_000, 123_456, 1_048_576, 9_999_999])
def test_tally_keeps_values_within_a_tenth_of_a_percent(value: int) -> None:
    counts: dict[int, int] = {}
    tally(counts, value, 3)
    ((kept, count),) = counts.items()
    assert count == 3
    assert kept <= value
    assert value - kept <= value * 0.001


def test_snapshot_holds_counters_and_distributions() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=90, failed=10, latency_ms=40)
    wall.now += 10
    snapshot = recorder.snapshot()
    assert snapshot.records_put == 100
    assert snapshot.records_succeeded == 90
    assert snapshot.failures == {"ProvisionedThroughputExceededException": 10}
    assert snapshot.success_rate == pytest.approx(0.9)
    assert snapshot.throughput == pytest.approx(9.0)
    assert snapshot.percentile("latency_ms", 50) == 40
    assert snapshot.distribution("attempts").get_total_count() == 90
    assert set(snapshot.distributions) == set(DISTRIBUTIONS)


def test_interval_snapshots_cover_only_their_interval() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=5, failed=1, latency_ms=10)
    wall.now += 1
    first = recorder.interval_snapshot()
    assert (first.records_succeeded, first.records_failed, first.elapsed) == (5, 1, 1.0)

    recorder.records_succeeded += 7
    tally(recorder.tallies["latency_ms"], 300, 7)
    wall.now += 2
    second = recorder.interval_snapshot()
    assert second.records_succeeded == 7
    assert second.records_failed == 0
    assert dict(second.failures) == {}
    assert second.elapsed == 2.0
    assert second.distribution("latency_ms").get_total_count() == 7
    assert second.percentile("latency_ms", 1) == 300
    # the cumulative view still has everything
    total = recorder.snapshot()
    assert total.records_succeeded == 12
    assert total.distribution("latency_ms").get_total_count() == 12


def test_merge_adds_counters_combines_distributions_and_spans_windows() -> None:
    wall_a, wall_b = FakeWall(100.0), FakeWall(105.0)
    a = recorder_with(wall_a, succeeded=10, failed=2, latency_ms=20, stream="one")
    b = recorder_with(wall_b, succeeded=30, failed=0, latency_ms=500, stream="two")
    wall_a.now, wall_b.now = 110.0, 120.0
    merged = a.snapshot().merge(b.snapshot())
    assert merged.stream == "*"
    assert (merged.started_at, merged.ended_at) == (100.0, 120.0)
    assert merged.records_succeeded == 40
    assert merged.records_failed == 2
    assert merged.put_records_calls == 4
    assert merged.failures == {"ProvisionedThroughputExceededException": 2}
    latency = merged.distribution("latency_ms")
    assert latency.get_total_count() == 40
    assert merged.percentile("latency_ms", 25) == 20
    assert merged.percentile("latency_ms", 100) == pytest.approx(500, rel=0.001)
    assert merged.throughput == pytest.approx(40 / 20)


def test_merge_is_associative_for_counters_and_keeps_inputs_untouched() -> None:
    snapshots = [
        recorder_with(FakeWall(), succeeded=n, failed=1, latency_ms=n).snapshot() for n in (1, 2, 3)
    ]
    left = snapshots[0].merge(snapshots[1]).merge(snapshots[2])
    right = snapshots[0].merge(snapshots[1].merge(snapshots[2]))
    assert left.records_succeeded == right.records_succeeded == 6
    assert left.failures == right.failures
    assert snapshots[0].distribution("latency_ms").get_total_count() == 1


def test_empty_snapshot_has_sane_derived_values() -> None:
    empty = ProducerMetricsSnapshot(stream="s", started_at=5.0, ended_at=5.0)
    assert empty.throughput == 0.0
    assert empty.success_rate == 1.0
    merged = empty.merge(empty)
    assert merged.percentile("latency_ms", 99) == 0
    assert merged.summary()["records_put"] == 0


def test_prometheus_collector_exports_counters_and_histograms() -> None:
    wall = FakeWall()
    recorder = recorder_with(wall, succeeded=8, failed=2, latency_ms=30, stream="orders")
    tally(recorder.tallies["latency_ms"], 700, 2)
    registry = CollectorRegistry()
    registry.register(ProducerCollector(recorder.snapshot, recorder.snapshot))
    text = generate_latest(registry).decode()
    # two sources of the same stream are merged
    assert 'shardflow_producer_records_succeeded_total{stream="orders"} 16.0' in text
    assert (
        'shardflow_producer_records_failed_total{code="ProvisionedThroughputExceededException",'
        'stream="orders"} 4.0'
    ) in text
    assert (
        'shardflow_producer_record_latency_seconds_bucket{le="0.05",stream="orders"} 16.0' in text
    )
    assert 'shardflow_producer_record_latency_seconds_bucket{le="1",stream="orders"} 20.0' in text
    assert 'shardflow_producer_record_latency_seconds_count{stream="orders"} 20.0' in text
    assert 'shardflow_producer_put_records_calls_total{stream="orders"} 4.0' in text
