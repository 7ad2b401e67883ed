"""The end-to-end check: the Parquet windows and the consumed alerts against the ledger."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from demo.ledger import Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Key = tuple[str, str]


@dataclass(frozen=True)
class WindowTotals:
    """What the revenue job wrote, summed over its windows."""

    rows: int
    windows: int
    repeated_rows: int
    counts: Counter[Key]
    amounts: dict[Key, Decimal]

    @property
    def events(self) -> int:
        return sum(self.counts.values())

    @property
    def revenue(self) -> Decimal:
        return sum((a for (kind, _), a in self.amounts.items() if kind == "order"), Decimal(0))


@dataclass(frozen=True)
class Verdict:
    """Each check's finding; ``problems`` is empty when everything was counted exactly once."""

    windows: WindowTotals
    alerts_consumed: int
    missing_alerts: int
    duplicate_alerts: int
    unexpected_alerts: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def read_windows(spark: SparkSession, output: Path) -> WindowTotals:
    """Sum the Parquet output (read by Spark, which honours the file sink's commit log)."""
    rows = spark.read.parquet(str(output)).collect()
    counts: Counter[Key] = Counter()
    amounts: dict[Key, Decimal] = {}
    cells = Counter((r.window_start, r.type, r.segment) for r in rows)
    for row in rows:
        key = (row.type, row.segment)
        counts[key] += row.events
        amounts[key] = amounts.get(key, Decimal(0)) + row.amount
    return WindowTotals(
        rows=len(rows),
        windows=len({r.window_start for r in rows}),
        repeated_rows=sum(n - 1 for n in cells.values() if n > 1),
        counts=counts,
        amounts=amounts,
    )


def verify(ledger: Ledger, windows: WindowTotals, alerts: Counter[str]) -> Verdict:
    """Compare every total; each mismatch becomes one line in ``problems``."""
    problems: list[str] = []
    if windows.repeated_rows:
        problems.append(f"{windows.repeated_rows} window rows were written more than once")
    if windows.events != ledger.events:
        problems.append(f"Parquet counts {windows.events} events, {ledger.events} were produced")
    for key in sorted(set(ledger.counts) | set(windows.counts)):
        produced, counted = ledger.counts[key], windows.counts[key]
        if produced != counted:
            problems.append(f"{'/'.join(key)}: produced {produced}, counted {counted}")
        produced_amount = ledger.amounts.get(key, Decimal(0))
        counted_amount = windows.amounts.get(key, Decimal(0))
        if produced_amount != counted_amount:
            problems.append(
                f"{'/'.join(key)}: produced EUR {produced_amount}, summed EUR {counted_amount}"
            )
    missing = len(ledger.large_orders - set(alerts))
    duplicates = sum(1 for n in alerts.values() if n > 1)
    unexpected = len(set(alerts) - ledger.large_orders)
    if missing or duplicates or unexpected:
        problems.append(
            f"alerts: {missing} large orders without an alert, {duplicates} alerted more than "
            f"once, {unexpected} alerts for no large order"
        )
    return Verdict(windows, sum(alerts.values()), missing, duplicates, unexpected, problems)
