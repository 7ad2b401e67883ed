"""What a streaming query has done so far, from its progress reports (one per micro-batch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


@dataclass
class QueryTracker:
    """Totals over every progress report seen; call :meth:`poll` often (Spark keeps only the
    last 100 reports)."""

    query: StreamingQuery
    batches: dict[int, dict[str, Any]] = field(default_factory=dict)

    def poll(self) -> None:
        for report in self.query.recentProgress:
            self.batches.setdefault(int(report["batchId"]), dict(report))

    @property
    def input_rows(self) -> int:
        return sum(int(r.get("numInputRows") or 0) for r in self.batches.values())

    @property
    def output_rows(self) -> int:
        """Rows the sink reported written (-1 reports, "unknown", are left out)."""
        rows = (int((r.get("sink") or {}).get("numOutputRows", -1)) for r in self.batches.values())
        return sum(n for n in rows if n > 0)

    @property
    def state_rows(self) -> int:
        """Rows held in the query's state after its latest batch (open windows, for the
        revenue job)."""
        if not self.batches:
            return 0
        latest = self.batches[max(self.batches)]
        return sum(int(op.get("numRowsTotal") or 0) for op in latest.get("stateOperators") or [])

    @property
    def data_batches(self) -> int:
        """Micro-batches that had input rows (Spark also runs empty ones, e.g. after the
        watermark moved)."""
        return sum(1 for r in self.batches.values() if r.get("numInputRows"))

    @property
    def watermark(self) -> datetime | None:
        """The latest watermark a finished batch ran with (None before the first)."""
        marks = [
            datetime.fromisoformat(str(r["eventTime"]["watermark"]).replace("Z", "+00:00"))
            for r in self.batches.values()
            if (r.get("eventTime") or {}).get("watermark")
        ]
        return max(marks, default=None)

    @property
    def failure(self) -> str | None:
        """The query's error, if it stopped with one."""
        error = self.query.exception()
        return None if error is None else str(error)
