"""Realistic business events for the demo: orders and the payments that follow them.

Customers follow a skewed popularity (a few are very active), amounts depend on the category,
and every order is followed by one or two payment attempts for the same customer, so per-key
order matters: a payment must never be seen before its order.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

CATEGORIES: dict[str, tuple[float, float]] = {
    # category: (typical amount, spread) in EUR
    "books": (18.0, 8.0),
    "electronics": (240.0, 180.0),
    "grocery": (42.0, 20.0),
    "fashion": (65.0, 35.0),
    "home": (90.0, 60.0),
    "toys": (30.0, 15.0),
}
PAYMENT_METHODS = ("card", "card", "card", "paypal", "bank_transfer", "voucher")


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its partition key (the customer) and its JSON body."""

    partition_key: str
    body: dict[str, Any]

    def to_bytes(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


def generate_events(
    count: int,
    *,
    customers: int = 500,
    seed: int = 7,
    start: datetime | None = None,
    events_per_second: float = 50.0,
) -> Iterator[Event]:
    """``count`` events: orders, each followed by its payment attempt(s), in time order."""
    rng = random.Random(seed)
    clock = start or datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(customers)]
    customer_ids = [f"cust-{n:05d}" for n in range(customers)]
    produced = 0
    while produced < count:
        clock += timedelta(seconds=rng.expovariate(events_per_second))
        customer = rng.choices(customer_ids, weights)[0]
        category = rng.choice(list(CATEGORIES))
        typical, spread = CATEGORIES[category]
        amount = round(max(1.0, rng.gauss(typical, spread)), 2)
        order_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        yield Event(
            customer,
            {
                "type": "order",
                "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "order_id": order_id,
                "customer_id": customer,
                "category": category,
                "amount": amount,
                "currency": "EUR",
                "items": rng.randint(1, 5),
                "ts": clock.isoformat(),
            },
        )
        produced += 1
        # A declined first attempt is retried once, as shops do.
        attempts = 2 if rng.random() < 0.08 else 1
        for attempt in range(attempts):
            if produced >= count:
                break
            clock += timedelta(milliseconds=rng.randint(200, 4000))
            yield Event(
                customer,
                {
                    "type": "payment",
                    "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "order_id": order_id,
                    "customer_id": customer,
                    "method": rng.choice(PAYMENT_METHODS),
                    "amount": amount,
                    "status": "declined" if attempt < attempts - 1 else "captured",
                    "ts": clock.isoformat(),
                },
            )
            produced += 1
