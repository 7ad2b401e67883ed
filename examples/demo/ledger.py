"""What the pipeline must find: the produced events, tallied the way the Spark job tallies them.

The aggregate job groups business events by one-minute window, type and *segment* (the
category of an order, ``method/status`` of a payment); the ledger keeps the same totals from
the generator's side, with amounts as ``Decimal`` so the comparison is exact to the cent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

LARGE_ORDER_EUR = Decimal("400")
"""An order at least this large raises an alert."""


def segment_of(body: dict[str, Any]) -> str:
    """The grouping key within a type (the Spark job computes the same expression)."""
    if body["type"] == "order":
        return str(body["category"])
    return f"{body['method']}/{body['status']}"


def is_large_order(body: dict[str, Any]) -> bool:
    return body["type"] == "order" and Decimal(str(body["amount"])) >= LARGE_ORDER_EUR


@dataclass
class Ledger:
    """Totals of everything produced so far (filled by the feed, read after it finished)."""

    events: int = 0
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    amounts: dict[tuple[str, str], Decimal] = field(default_factory=dict)
    large_orders: set[str] = field(default_factory=set)
    last_event_time: datetime | None = None

    def add(self, body: dict[str, Any]) -> None:
        key = (str(body["type"]), segment_of(body))
        self.events += 1
        self.counts[key] += 1
        self.amounts[key] = self.amounts.get(key, Decimal(0)) + Decimal(str(body["amount"]))
        if is_large_order(body):
            self.large_orders.add(str(body["order_id"]))
        moment = datetime.fromisoformat(body["ts"])
        if self.last_event_time is None or moment > self.last_event_time:
            self.last_event_time = moment

    @property
    def revenue(self) -> Decimal:
        """The sum of all order amounts."""
        return sum(
            (amount for (kind, _), amount in self.amounts.items() if kind == "order"), Decimal(0)
        )
