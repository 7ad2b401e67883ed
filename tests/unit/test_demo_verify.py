"""The demo's end-to-end check finds every kind of miscount (it must be able to fail)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest

from demo.events import generate_events
from demo.ledger import LARGE_ORDER_EUR, Ledger, is_large_order, segment_of
from demo.verify import WindowTotals, verify


def ledger_of(count: int) -> Ledger:
    ledger = Ledger()
    for event in generate_events(count):
        ledger.add(event.body)
    return ledger


def windows_matching(ledger: Ledger, *, repeated: int = 0) -> WindowTotals:
    return WindowTotals(
        rows=len(ledger.counts),
        windows=1,
        repeated_rows=repeated,
        counts=Counter(ledger.counts),
        amounts=dict(ledger.amounts),
    )


def test_matching_totals_and_one_alert_per_large_order_pass() -> None:
    ledger = ledger_of(400)
    assert ledger.large_orders, "the generator makes large orders"
    verdict = verify(ledger, windows_matching(ledger), Counter(ledger.large_orders))
    assert verdict.ok, verdict.problems
    assert verdict.alerts_consumed == len(ledger.large_orders)


def test_a_lost_event_a_cent_and_a_repeated_window_are_each_reported() -> None:
    ledger = ledger_of(400)
    windows = windows_matching(ledger, repeated=1)
    key = next(iter(windows.counts))
    windows.counts[key] -= 1
    windows.amounts[key] += Decimal("0.01")
    verdict = verify(ledger, windows, Counter(ledger.large_orders))
    assert not verdict.ok
    text = "\n".join(verdict.problems)
    assert "1 window rows were written more than once" in text
    assert "399 events, 400 were produced" in text
    assert f"{'/'.join(key)}: produced {ledger.counts[key]}, counted" in text
    assert "summed EUR" in text


def test_missing_duplicate_and_unexpected_alerts_are_counted() -> None:
    ledger = ledger_of(400)
    alerts = Counter(ledger.large_orders)
    first, second = sorted(ledger.large_orders)[:2]
    del alerts[first]
    alerts[second] += 1
    alerts["not-an-order"] += 1
    verdict = verify(ledger, windows_matching(ledger), alerts)
    assert (verdict.missing_alerts, verdict.duplicate_alerts, verdict.unexpected_alerts) == (
        1,
        1,
        1,
    )
    assert not verdict.ok


def test_segments_and_the_large_order_threshold() -> None:
    order = {"type": "order", "category": "toys", "amount": float(LARGE_ORDER_EUR)}
    payment = {"type": "payment", "method": "card", "status": "declined", "amount": 900.0}
    assert segment_of(order) == "toys"
    assert segment_of(payment) == "card/declined"
    assert is_large_order(order)
    assert not is_large_order({**order, "amount": 399.99})
    assert not is_large_order(payment)


def test_the_demo_says_in_one_line_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    from demo import needs

    assert needs.missing(spark=True) is None  # the dev environment has everything
    monkeypatch.setattr(needs, "_importable", lambda module: module not in {"pyspark"})
    assert needs.missing(spark=True) == (
        "the demo needs the spark extra(s): pip install 'shardflow[spark]'"
    )
    assert needs.missing(spark=False) is None
    monkeypatch.setattr(needs, "_importable", lambda module: True)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert "Java 17" in (needs.missing(spark=True) or "")
