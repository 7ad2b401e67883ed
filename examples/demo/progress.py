"""The live view of a running pipeline: one table, redrawn while the stages advance."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from demo.alerts import AlertDesk
from demo.feed import Feed
from demo.tracking import QueryTracker


@dataclass
class PipelineView:
    """The moving parts whose counters the table shows."""

    feed: Feed
    revenue: QueryTracker
    alerts: QueryTracker
    desk: AlertDesk

    def table(self, elapsed: float) -> Table:
        table = Table(title=f"shardflow Spark pipeline, {elapsed:4.0f}s", title_justify="left")
        table.add_column("stage")
        table.add_column("progress", justify="right")
        feed = self.feed
        table.add_row(
            "producer -> orders stream",
            f"{feed.produced:,} / {feed.total:,} events ({feed.kinesis_records:,} Kinesis records)",
        )
        watermark = self.revenue.watermark
        table.add_row(
            "Spark revenue job -> Parquet",
            f"{self.revenue.data_batches} batches, {self.revenue.input_rows:,} rows in, "
            f"{self.revenue.state_rows:,} window rows open, watermark "
            + (watermark.strftime("%H:%M:%S") if watermark else "-"),
        )
        table.add_row(
            "Spark alerts job -> alerts stream",
            f"{self.alerts.data_batches} batches, {self.alerts.input_rows:,} rows in, "
            f"{self.alerts.output_rows:,} alerts out",
        )
        table.add_row("consumer <- alerts stream", f"{self.desk.consumed:,} alerts consumed")
        return table
