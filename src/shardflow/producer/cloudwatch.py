"""The producer's metrics under the KPL's CloudWatch names (``ProducerSettings(metrics=
CloudWatch())``): what a KPL dashboard or alarm reads keeps working after a migration.

Nothing is added to a record's path: at each send, :class:`KplMetrics` takes the interval of
the producer's own counters and distributions (:class:`~shardflow.producer.metrics.
MetricsRecorder`, its CloudWatch reader) and turns it into the KPL's statistic sets. Each
metric goes out twice, as the KPL's ``STREAM`` granularity does: with ``StreamName``, and
without any dimension (the KPL's global metric). The operations guide has the table, metric by
metric, with what is not published and why.
"""

from __future__ import annotations

from collections.abc import Callable

from shardflow.metrics.cloudwatch import CloudWatchPublisher, MetricBuffer, MetricsLevel, Unit
from shardflow.metrics.recording import Histogram
from shardflow.producer.metrics import MetricsRecorder

READER = "cloudwatch"
"""The recorder's interval reader of the publisher (``on_metrics`` has its own)."""

Values = tuple[int, float, float, float]
"""A statistic set's (count, sum, minimum, maximum)."""


class KplMetrics:
    """Feeds a :class:`CloudWatchPublisher` with the KPL's metrics of one producer (its
    ``collect``, called on the producer's event loop before each send)."""

    def __init__(
        self,
        publisher: CloudWatchPublisher,
        recorder: MetricsRecorder,
        *,
        stream_name: str,
        pending: Callable[[], int],
    ) -> None:
        self.publisher = publisher
        publisher.collect = self.collect
        self._recorder = recorder
        recorder.open_interval(READER)
        self._pending = pending
        self._errors_base: dict[str, int] = dict(recorder.errors_by_code)
        self._last_dropped = 0
        self._request_time = recorder.request_time
        self._per_request = recorder.user_records_per_request
        self._request_time.open_interval(READER)
        self._per_request.open_interval(READER)
        # Every metric with StreamName and without (the KPL's STREAM and GLOBAL levels); with
        # StreamName not enabled, only once (the two would be the same metric, counted twice).
        by_stream = "StreamName" in publisher.settings.dimensions
        self._scopes: tuple[dict[str, str], ...] = (
            ({"StreamName": stream_name}, {}) if by_stream else ({},)
        )

    def collect(self, buffer: MetricBuffer) -> None:
        """Add the interval since the last send to ``buffer``."""
        snap = self._recorder.interval_snapshot(READER)
        errors = self._new_errors()
        request_time = self._request_time.interval_snapshot(READER)
        per_request = self._per_request.interval_snapshot(READER)
        pending = self._pending()

        def add(name: str, unit: Unit, level: MetricsLevel, values: Values) -> None:
            for scope in self._scopes:
                buffer.add_set(name, unit, level, values, **scope)

        received = snap.records_put
        add("UserRecordsReceived", "Count", "DETAILED", (received, received, 1.0, 1.0))
        add("UserRecordsPending", "Count", "DETAILED", (1, pending, pending, pending))
        # 1 per record written, 0 per record failed (as the KPL): Average is the success rate.
        add(
            "UserRecordsPut",
            "Count",
            "SUMMARY",
            _ones_and_zeros(snap.records_succeeded, snap.records_failed),
        )
        add(
            "UserRecordsDataPut",
            "Bytes",
            "DETAILED",
            _data_put(snap.records_succeeded, snap.bytes_succeeded, snap.record_bytes),
        )
        add(
            "KinesisRecordsPut",
            "Count",
            "SUMMARY",
            _ones_and_zeros(snap.entries_succeeded, snap.entries_failed),
        )
        all_errors = sum(errors.values())
        for code, count in sorted(errors.items()):
            for scope in self._scopes:
                buffer.add_set(
                    "ErrorsByCode",
                    "Count",
                    "SUMMARY",
                    (count, count, 1.0, 1.0),
                    ErrorCode=code,
                    **scope,
                )
        if all_errors:
            add("AllErrors", "Count", "SUMMARY", (all_errors, all_errors, 1.0, 1.0))
        # Attempts per finished record, less the first: retries, 0 for a first-time success.
        attempts = snap.attempts
        if attempts.count:
            add(
                "RetriesPerRecord",
                "Count",
                "DETAILED",
                (
                    attempts.count,
                    attempts.sum - attempts.count,
                    attempts.min - 1,
                    attempts.max - 1,
                ),
            )
        add("RequestTime", "Milliseconds", "DETAILED", _values(request_time, 1000.0))
        add(
            "UserRecordsPerKinesisRecord",
            "Count",
            "DETAILED",
            _values(snap.records_per_kinesis_record),
        )
        add(
            "KinesisRecordsPerPutRecordsRequest",
            "Count",
            "DETAILED",
            _values(snap.request_records),
        )
        add("UserRecordsPerPutRecordsRequest", "Count", "DETAILED", _values(per_request))
        # shardflow's own (no KPL name): values dropped since the last send that got through.
        dropped = self.publisher.dropped
        lost, self._last_dropped = dropped - self._last_dropped, dropped
        add("MetricsDropped", "Count", "SUMMARY", (1, lost, lost, lost))

    def _new_errors(self) -> dict[str, int]:
        now = self._recorder.errors_by_code
        base = self._errors_base
        new = {code: n - base.get(code, 0) for code, n in now.items() if n != base.get(code, 0)}
        self._errors_base = dict(now)
        return new


def _ones_and_zeros(ones: int, zeros: int) -> Values:
    count = ones + zeros
    return (count, float(ones), 0.0 if zeros else 1.0, 1.0 if ones else 0.0)


def _data_put(records: int, total: int, sizes: Histogram) -> Values:
    # Sum and count are the records written; their smallest and largest sizes are those of
    # the records accepted in the interval (what the producer measures without per-record work
    # on the way back), kept within the written bytes' own bounds.
    if not records:
        return (0, 0.0, 0.0, 0.0)
    mean = total / records
    low = min(sizes.min, mean) if sizes.count else mean
    high = max(sizes.max, mean) if sizes.count else mean
    return (records, float(total), low, high)


def _values(histogram: Histogram, scale: float = 1.0) -> Values:
    if not histogram.count:
        return (0, 0.0, 0.0, 0.0)
    return (
        histogram.count,
        histogram.sum * scale,
        histogram.min * scale,
        histogram.max * scale,
    )
