"""The closing table of the Spark demo and its one-line verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from demo.ledger import LARGE_ORDER_EUR, Ledger
from demo.tracking import QueryTracker
from demo.verify import Verdict


def print_summary(
    console: Console,
    *,
    ledger: Ledger,
    kinesis_records: int,
    revenue: QueryTracker,
    alerts: QueryTracker,
    verdict: Verdict,
    elapsed: float,
) -> None:
    windows = verdict.windows
    kinds = {kind for kind, _ in ledger.counts}
    per_kind = {k: sum(n for (kind, _), n in ledger.counts.items() if kind == k) for k in kinds}
    table = Table(title="shardflow demo: orders and payments through Spark Structured Streaming")
    table.add_column("check")
    table.add_column("produced", justify="right")
    table.add_column("found", justify="right")
    table.add_row(
        "events (orders / payments)",
        f"{ledger.events:,} ({per_kind.get('order', 0):,} / {per_kind.get('payment', 0):,})",
        f"{windows.events:,} counted in Parquet",
    )
    table.add_row("order revenue (EUR)", f"{ledger.revenue:,}", f"{windows.revenue:,}")
    table.add_row(
        f"large orders (>= EUR {LARGE_ORDER_EUR})",
        f"{len(ledger.large_orders):,}",
        f"{verdict.alerts_consumed:,} alerts consumed",
    )
    table.add_row(
        "missing / duplicate / unexpected alerts",
        "",
        f"{verdict.missing_alerts} / {verdict.duplicate_alerts} / {verdict.unexpected_alerts}",
    )
    table.add_row(
        "Parquet rows (window x type x segment)",
        "",
        f"{windows.rows:,} in {windows.windows} one-minute windows",
    )
    table.add_row("Kinesis records (KPL-aggregated)", f"{kinesis_records:,}", "")
    table.add_row(
        "Spark micro-batches with data (revenue / alerts)",
        "",
        f"{revenue.data_batches} / {alerts.data_batches}",
    )
    top = sorted(
        (
            (segment, amount)
            for (kind, segment), amount in windows.amounts.items()
            if kind == "order"
        ),
        key=lambda item: -item[1],
    )
    table.add_row("revenue by category (EUR)", "", ", ".join(f"{c} {a:,.0f}" for c, a in top))
    table.add_row("wall time", "", f"{elapsed:.0f}s")
    console.print(table)
    if verdict.ok:
        console.print(
            f"[bold green]verified:[/] every one of {ledger.events:,} events counted exactly once "
            f"in the Parquet windows; all {len(ledger.large_orders):,} large orders became "
            "exactly one consumed alert"
        )
    else:
        console.print("[bold red]verification FAILED:[/]")
        for problem in verdict.problems[:20]:
            console.print(f"  - {problem}")
