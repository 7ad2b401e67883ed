"""The one Backoff: ceilings, jitter kinds and the attempt bound."""

from __future__ import annotations

import random

import pytest

from shardflow.backoff import NO_BACKOFF, Backoff


def test_ceilings_grow_by_the_multiplier_up_to_the_cap() -> None:
    backoff = Backoff(base=0.1, cap=1.0, multiplier=3.0, jitter="none")
    assert [backoff.delay(n) for n in range(4)] == pytest.approx([0.1, 0.3, 0.9, 1.0])


@pytest.mark.parametrize("attempt", range(6))
def test_half_jitter_stays_in_the_upper_half(attempt: int) -> None:
    backoff = Backoff(base=0.4, cap=10.0, jitter="half")
    ceiling = min(10.0, 0.4 * 2**attempt)
    rng = random.Random(attempt)
    delays = [backoff.delay(attempt, rng) for _ in range(300)]
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert max(delays) - min(delays) > ceiling / 4  # drawn, not fixed


def test_attempt_bound() -> None:
    assert Backoff(max_attempts=3).allows(2)
    assert not Backoff(max_attempts=3).allows(3)
    assert Backoff(max_attempts=None).allows(10**6)


def test_no_backoff_retries_at_once() -> None:
    assert NO_BACKOFF.delay(5) == 0.0


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"base": -1.0}, "negative"),
        ({"cap": -1.0}, "negative"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"jitter": "some"}, "jitter"),
    ],
)
def test_invalid_settings_are_refused(options: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        Backoff(**options)  # type: ignore[arg-type]
