"""The KPL's metrics from the producer's recorder: levels, dimensions, and intervals that
CloudWatch and ``on_metrics`` each see whole."""

from __future__ import annotations

from shardflow.metrics.cloudwatch import CloudWatch, CloudWatchPublisher, MetricBuffer
from shardflow.producer.cloudwatch import KplMetrics
from shardflow.producer.metrics import MetricsRecorder


def add_traffic(recorder: MetricsRecorder) -> None:
    """10 records accepted, 9 written, 1 failed after 3 attempts; 12 entries sent, 3 refused."""
    recorder.records_put += 10
    recorder.records_succeeded += 9
    recorder.bytes_succeeded += 900
    recorder.failed("ProvisionedThroughputExceededException")
    recorder.entries_succeeded += 9
    recorder.entries_failed += 3
    errors = recorder.errors_by_code
    errors["ProvisionedThroughputExceededException"] = (
        errors.get("ProvisionedThroughputExceededException", 0) + 3
    )
    recorder.attempts.add(1, 8)
    recorder.attempts.add(3, 2)
    recorder.record_bytes.add(100, 10)
    recorder.request_time.add(0.004)
    recorder.request_records.add(12)
    recorder.user_records_per_request.add(12)
    recorder.records_per_kinesis_record.add(1, 12)


def collected(settings: CloudWatch) -> MetricBuffer:
    recorder = MetricsRecorder("orders")
    add_traffic(recorder)  # before the publisher attached: not its interval
    publisher = CloudWatchPublisher(settings, "KinesisProducerLibrary")
    KplMetrics(publisher, recorder, stream_name="orders", pending=lambda: 4)
    add_traffic(recorder)
    buffer = MetricBuffer(settings)
    assert publisher.collect is not None
    publisher.collect(buffer)
    return buffer


def test_every_metric_with_stream_name_and_globally() -> None:
    buffer = collected(CloudWatch())
    for dims in ({"StreamName": "orders"}, {}):
        put = buffer.get("UserRecordsPut", **dims)
        assert put is not None
        assert (put.count, put.total, put.minimum, put.maximum) == (10, 9, 0, 1)
        retries = buffer.get("RetriesPerRecord", **dims)
        assert retries is not None
        assert (retries.count, retries.total, retries.maximum) == (10, 4, 2)
        by_code = buffer.get(
            "ErrorsByCode", ErrorCode="ProvisionedThroughputExceededException", **dims
        )
        assert by_code is not None
        assert by_code.total == 3
        request = buffer.get("RequestTime", **dims)
        assert request is not None
        assert 3.9 < request.total < 4.1  # milliseconds
        pending = buffer.get("UserRecordsPending", **dims)
        assert pending is not None
        assert pending.total == 4
        kinesis = buffer.get("KinesisRecordsPut", **dims)
        assert kinesis is not None
        assert (kinesis.count, kinesis.total) == (12, 9)


def test_summary_level_and_no_stream_name_dimension() -> None:
    settings = CloudWatch(level="SUMMARY", dimensions=frozenset({"ErrorCode"}))
    buffer = collected(settings)
    names = {key[0] for key, _ in buffer.items()}
    assert names == {
        "UserRecordsPut",
        "KinesisRecordsPut",
        "ErrorsByCode",
        "AllErrors",
        "MetricsDropped",
    }
    # Without StreamName each metric goes out once, globally: nothing counted twice.
    put = buffer.get("UserRecordsPut")
    assert put is not None
    assert put.count == 10
    assert all(dict(key[2]).keys() <= {"ErrorCode"} for key, _ in buffer.items())


def test_cloudwatch_and_on_metrics_each_see_every_value() -> None:
    recorder = MetricsRecorder("orders")
    publisher = CloudWatchPublisher(CloudWatch(), "KinesisProducerLibrary")
    KplMetrics(publisher, recorder, stream_name="orders", pending=lambda: 0)
    recorder.records_succeeded += 5
    recorder.attempts.add(1, 5)
    assert recorder.interval_snapshot().attempts.count == 5  # on_metrics' interval
    buffer = MetricBuffer(publisher.settings)
    assert publisher.collect is not None
    publisher.collect(buffer)  # CloudWatch's: the same values, not taken by on_metrics
    put = buffer.get("UserRecordsPut", StreamName="orders")
    assert put is not None
    assert put.total == 5
    retries = buffer.get("RetriesPerRecord", StreamName="orders")
    assert retries is not None
    assert retries.count == 5
    assert recorder.interval_snapshot().attempts.count == 0
