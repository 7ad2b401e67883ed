"""``make demo``: the Spark pipeline on the embedded local stack, verified end to end.

local stack up (Kinesis on kinesalite, DynamoDB on moto) -> orders and alerts streams ->
Spark local[2] starts two streaming queries over the orders stream (shardflow source) ->
an alert desk consumes the alerts stream (shardflow consumer, leases in DynamoDB) -> the feed
produces orders and payments for a while -> once Spark has read them all, a closing tick moves
the watermark past the last window -> the Parquet windows and the consumed alerts are checked
against what was produced -> summary -> everything stopped, working files removed (the
Parquet output stays and its path is printed).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live

from demo.alerts import AlertDesk
from demo.feed import Feed, send_closing_tick
from demo.foundation import use_local_credentials
from demo.jobs import Endpoints, start_alerts_job, start_revenue_job, start_spark
from demo.progress import PipelineView
from demo.summary import print_summary
from demo.tracking import QueryTracker
from demo.verify import Verdict, read_windows, verify
from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.kinesis import wait_for_active
from shardflow.errors import ShardflowError
from shardflow.local import LocalStack

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from support.spark_cluster import StandaloneCluster

REGION = "us-east-1"
ORDERS_STREAM = "demo-orders"
ALERTS_STREAM = "demo-large-order-alerts"
METADATA_BUCKET = "shardflow-demo-metadata"
POLL = 0.5


class DemoFailed(ShardflowError):
    """A stage did not finish in time or broke; the message says which and how far it got."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """How big and how long the demo runs, and where the Parquet output goes."""

    events: int = 6000
    feed_seconds: float = 45.0
    shards: int = 2
    output: Path | None = None
    timeout: float = 300.0
    # A standalone cluster (Master + 2 Workers) instead of local[2]; batch ends on moto's S3.
    cluster: bool = False


def run_pipeline(settings: DemoSettings, console: Console) -> bool:
    """Run the whole demo; True if the end-to-end verification passed."""
    began = time.monotonic()
    output_root = settings.output or Path(tempfile.mkdtemp(prefix="shardflow-demo-"))
    parquet = output_root / "revenue-per-minute"
    work = Path(tempfile.mkdtemp(prefix="shardflow-demo-work-"))
    try:
        console.print("[bold]1.[/] starting the local stack: kinesalite (Kinesis), moto (DynamoDB)")
        with LocalStack(moto=True, kinesalite=True) as stack:
            use_local_credentials(stack)
            kinesis = AwsSettings(endpoint_url=stack.kinesalite.endpoint_url, region=REGION)
            dynamodb = AwsSettings(endpoint_url=stack.moto.endpoint_url, region=REGION)
            asyncio.run(_create_streams(kinesis, settings.shards))
            console.print(
                f"[bold]2.[/] streams [cyan]{ORDERS_STREAM}[/] ({settings.shards} shards) and "
                f"[cyan]{ALERTS_STREAM}[/] (1 shard) at {kinesis.endpoint_url}"
            )
            where = Endpoints(kinesis.endpoint_url or "", REGION, ORDERS_STREAM, ALERTS_STREAM)
            if not settings.cluster:
                verdict = _run_with_spark(settings, console, where, dynamodb, work, parquet, began)
            else:
                asyncio.run(_create_bucket(dynamodb, METADATA_BUCKET))
                where = replace(
                    where,
                    metadata_root=f"s3://{METADATA_BUCKET}/demo",
                    metadata_endpoint=dynamodb.endpoint_url,
                )
                console.print("   a standalone Spark cluster: Master + 2 Workers on 127.0.0.1")
                with _standalone_cluster(work / "cluster") as cluster:
                    verdict = _run_with_spark(
                        settings, console, where, dynamodb, work, parquet, began,
                        cluster=cluster.session_config(),
                    )  # fmt: skip
        console.print("[bold]9.[/] local stack stopped")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if verdict is None:
        return False
    console.print(f"Parquet output: [cyan]{parquet}[/]")
    return verdict.ok


def _standalone_cluster(log_dir: Path) -> StandaloneCluster:
    """The test suite's standalone cluster (``tests/support/spark_cluster.py``): the demo runs
    from a clone of the repository, which has it."""
    tests = str(Path(__file__).resolve().parents[2] / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    from support.spark_cluster import StandaloneCluster

    return StandaloneCluster(log_dir)


async def _create_bucket(moto: AwsSettings, bucket: str) -> None:
    async with ClientFactory(moto).client("s3") as s3:
        await s3.create_bucket(Bucket=bucket)


async def _create_streams(kinesis: AwsSettings, shards: int) -> None:
    async with ClientFactory(kinesis).kinesis() as client:
        await client.create_stream(StreamName=ORDERS_STREAM, ShardCount=shards)
        await client.create_stream(StreamName=ALERTS_STREAM, ShardCount=1)
        await wait_for_active(client, ORDERS_STREAM)
        await wait_for_active(client, ALERTS_STREAM)


def _run_with_spark(
    settings: DemoSettings,
    console: Console,
    where: Endpoints,
    dynamodb: AwsSettings,
    work: Path,
    parquet: Path,
    began: float,
    cluster: dict[str, str] | None = None,
) -> Verdict | None:
    kinesis = AwsSettings(endpoint_url=where.kinesis_url, region=where.region)
    on = "the cluster" if cluster else "local[2]"
    console.print(f"[bold]3.[/] starting Spark ({on}) and its two streaming queries")
    spark = start_spark(work, cluster)
    queries: list[StreamingQuery] = []
    desk = AlertDesk(ALERTS_STREAM, "demo-alert-desk", kinesis=kinesis, dynamodb=dynamodb)
    try:
        queries.append(start_revenue_job(spark, where, work, parquet))
        queries.append(start_alerts_job(spark, where, work))
        revenue, alerts = QueryTracker(queries[0]), QueryTracker(queries[1])
        console.print(
            f"   Spark up after {time.monotonic() - began:.0f}s; [bold]4.[/] alert desk "
            "consuming with leases in DynamoDB"
        )
        desk.start()
        feed = Feed(ORDERS_STREAM, kinesis, events=settings.events, seconds=settings.feed_seconds)
        view = PipelineView(feed, revenue, alerts, desk)
        console.print(f"[bold]5.[/] producing {settings.events:,} orders and payments")
        feed.start()
        deadline = began + settings.timeout
        try:
            with Live(view.table(0), console=console, refresh_per_second=4) as live:
                run = _Runner(view, live, began, deadline)
                run.until("the feed finishes", lambda: feed.join(0))
                run.check_feed()
                ledger = feed.ledger
                run.until(
                    "Spark reads every event",
                    lambda: min(revenue.input_rows, alerts.input_rows) >= ledger.events,
                )
                assert ledger.last_event_time is not None
                send_closing_tick(ORDERS_STREAM, kinesis, ledger.last_event_time)
                live.console.print(
                    "[bold]6.[/] all events read; closing tick sent (moves the watermark past "
                    "the last window)"
                )
                last_window_end = _minute_end(ledger.last_event_time)
                began_of_time = datetime.min.replace(tzinfo=last_window_end.tzinfo)
                run.until(
                    "the watermark passes the last window",
                    lambda: (revenue.watermark or began_of_time) >= last_window_end,
                )
                run.until(
                    "the alerts job reads the tick", lambda: alerts.input_rows > ledger.events
                )
                run.until(
                    "the alert desk consumes every alert",
                    lambda: desk.consumed >= len(ledger.large_orders),
                )
                run.settle(2.0)  # a late duplicate would show up now
        except DemoFailed as failure:
            console.print(f"[bold red]demo failed:[/] {failure}")
            return None
        for query in queries:
            query.stop()
        console.print("[bold]7.[/] queries stopped; verifying")
        windows = read_windows(spark, parquet)
        desk.stop()
        verdict = verify(ledger, windows, desk.counts())
        print_summary(
            console,
            ledger=ledger,
            kinesis_records=feed.kinesis_records,
            revenue=revenue,
            alerts=alerts,
            verdict=verdict,
            elapsed=time.monotonic() - began,
        )
        return verdict
    finally:
        desk.stop()
        for query in queries:
            _stop_quietly(query)
        spark.stop()
        console.print("[bold]8.[/] Spark stopped")


class _Runner:
    """Waits for one condition after another, redrawing the view; fails past the deadline or
    when a part broke."""

    def __init__(self, view: PipelineView, live: Live, began: float, deadline: float) -> None:
        self.view = view
        self.live = live
        self.began = began
        self.deadline = deadline

    def until(self, what: str, condition: Callable[[], bool]) -> None:
        while True:
            self._refresh()
            if condition():
                return
            if time.monotonic() > self.deadline:
                raise DemoFailed(f"timed out waiting until {what}")
            time.sleep(POLL)

    def settle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.until(f"{seconds:g}s passed", lambda: time.monotonic() >= end)

    def check_feed(self) -> None:
        if self.view.feed.error is not None:
            raise DemoFailed(f"the feed failed: {self.view.feed.error!r}")

    def _refresh(self) -> None:
        view = self.view
        view.revenue.poll()
        view.alerts.poll()
        for tracker in (view.revenue, view.alerts):
            if tracker.failure:
                raise DemoFailed(f"query {tracker.query.name} failed: {tracker.failure}")
        if view.desk.error is not None:
            raise DemoFailed(f"the alert desk failed: {view.desk.error!r}")
        self.check_feed()
        self.live.update(view.table(time.monotonic() - self.began))


def _minute_end(moment: datetime) -> datetime:
    """The end of the one-minute window holding ``moment``."""
    return moment.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _stop_quietly(query: StreamingQuery) -> None:
    try:
        if query.isActive:
            query.stop()
    except Exception:  # stopping during shutdown: the session goes next anyway
        pass
