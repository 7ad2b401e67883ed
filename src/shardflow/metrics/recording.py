"""Measuring: what hot paths update (:class:`Tally`, :class:`RateMeter`) and what snapshots hold
(:class:`Histogram`), for the consumer and the producer alike.

One histogram type for every distribution, on HdrHistogram (3 significant digits). Its values
are in the base unit of what it measures: **seconds** for durations (handler calls, put to
result), bytes for sizes, a plain number for counts. Inside, a duration is kept as whole
microseconds, from 1 µs to a day (longer ones count as a day); sizes up to 64 MiB and counts up
to a million are kept as they are.

Recording costs a dict update per value: a :class:`Tally` rounds each value down to 11
significant bits (the histogram's own precision: less than 0.1 % off) and counts it; the counts are folded
into the HdrHistogram when a snapshot is taken, on the thread that records.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from hdrh.histogram import HdrHistogram

from shardflow.clock import Clock

T = TypeVar("T")

_SIGNIFICANT_FIGURES: Final = 3
KEPT_BITS: Final = 11
SMALL_VALUES: Final = 1 << KEPT_BITS
"""Stored values below this are counted as they are (a hot path may skip :func:`rounded`)."""


@dataclass(frozen=True, slots=True)
class Scale:
    """How one kind of value is kept: ``per_unit`` stored integers per base unit, at most
    ``highest`` of them."""

    name: str
    per_unit: int
    highest: int


SECONDS: Final = Scale("seconds", 1_000_000, 86_400 * 1_000_000)
"""Durations: kept as whole microseconds, up to a day."""
BYTES: Final = Scale("bytes", 1, 64 * 1024 * 1024)
COUNT: Final = Scale("count", 1, 1_000_000)


def rounded(stored: int) -> int:
    """``stored`` kept to 11 significant bits (rounded down: less than 0.1 % off), the
    resolution of the HdrHistogram it goes to (3 significant digits)."""
    if stored >= SMALL_VALUES:
        shift = stored.bit_length() - KEPT_BITS
        return (stored >> shift) << shift
    return stored


def _new_hdr(scale: Scale) -> Any:
    return HdrHistogram(1, scale.highest, _SIGNIFICANT_FIGURES)


class Histogram:
    """A distribution of values (one per handler call, per record, per request...): their
    count and sum, and any percentile, in the base unit of what is measured (seconds for
    durations). Immutable: snapshots hold them, :meth:`merge` makes a new one.

    Values are exact to 3 significant digits (0.1 %): a percentile is the highest value
    equivalent to the one found there, as HdrHistogram reports it.
    """

    __slots__ = ("_cumulative", "_hdr", "_scale", "_sum")

    def __init__(self, scale: Scale = SECONDS, hdr: Any = None, total: float = 0.0) -> None:
        """An empty histogram of ``scale``, or one over ``hdr`` (an HdrHistogram of stored
        integers, no longer changed by anyone) whose values add up to ``total``."""
        self._scale = scale
        self._hdr = hdr if hdr is not None else _new_hdr(scale)
        self._sum = total
        self._cumulative: list[int] | None = None

    @property
    def scale(self) -> Scale:
        """What the values are: their unit, and how they are kept."""
        return self._scale

    @property
    def count(self) -> int:
        """How many values."""
        return int(self._hdr.total_count)

    @property
    def sum(self) -> float:
        """All values added up."""
        return self._sum

    @property
    def mean(self) -> float:
        """The average value (0 when empty)."""
        return self._sum / self.count if self.count else 0.0

    @property
    def max(self) -> float:
        """The largest value (0 when empty)."""
        return self._value(self._hdr.get_max_value()) if self.count else 0.0

    @property
    def min(self) -> float:
        """The smallest value (0 when empty)."""
        return self._value(self._hdr.get_min_value()) if self.count else 0.0

    def percentile(self, percentile: float) -> float:
        """The value at ``percentile`` (0-100); 0 when empty."""
        total = self.count
        if not total:
            return 0.0
        target = max(int(min(percentile, 100.0) * total / 100 + 0.5), 1)
        index = bisect.bisect_left(self._counts_up_to(), target)
        hdr = self._hdr
        found = hdr.get_value_from_index(index)
        if percentile:
            return self._value(hdr.get_highest_equivalent_value(found))
        return self._value(hdr.get_lowest_equivalent_value(found))

    def cumulative_counts(self, bounds: Sequence[float]) -> list[int]:
        """How many values are at most each of ``bounds`` (ascending, in the base unit)."""
        cumulative = self._counts_up_to()
        last = len(cumulative) - 1
        counts = []
        for bound in bounds:
            stored = math.floor(bound * self._scale.per_unit + 1e-9)
            if stored < 0:
                counts.append(0)
                continue
            index = min(self._hdr.get_counts_array_index(stored), last)
            counts.append(cumulative[index])
        return counts

    def merge(self, other: Histogram) -> Histogram:
        """A histogram of both one's and the other's values (both left as they are)."""
        if other._scale != self._scale:
            raise ValueError(f"cannot merge {self._scale.name} with {other._scale.name}")
        hdr = _new_hdr(self._scale)
        hdr.add(self._hdr)
        hdr.add(other._hdr)
        return Histogram(self._scale, hdr, self._sum + other._sum)

    def _value(self, stored: int) -> float:
        return stored / self._scale.per_unit

    def _counts_up_to(self) -> list[int]:
        """Running totals of the counts array (made once: the histogram does not change)."""
        if self._cumulative is None:
            hdr = self._hdr
            self._cumulative = list(itertools.accumulate(hdr.counts[: hdr.counts_len]))
        return self._cumulative

    def __repr__(self) -> str:
        unit = self._scale.name
        if not self.count:
            return f"Histogram({unit}, empty)"
        return (
            f"Histogram({unit}, count={self.count}, p50={self.percentile(50):g}, "
            f"p99={self.percentile(99):g}, max={self.max:g})"
        )


class Tally:
    """One distribution's live values, cheap to add to; :meth:`snapshot` folds them into an
    HdrHistogram. Used on one thread (the event loop that records).

    ``counts`` maps a stored value (see :class:`Scale`, rounded by :func:`rounded`) to how many
    times it came: a hot path may update it directly. With ``interval=True`` it also keeps what
    came since the last :meth:`interval_snapshot`; :meth:`open_interval` adds another reader's
    interval (CloudWatch's, besides ``on_metrics``'), each with its own start.
    """

    __slots__ = ("_intervals", "_sum", "_total", "counts", "scale")

    def __init__(self, scale: Scale = SECONDS, *, interval: bool = False) -> None:
        self.scale = scale
        self.counts: dict[int, int] = {}
        self._total = _new_hdr(scale)
        self._sum = 0
        # Per reader of intervals: [the values since its last interval snapshot, their sum].
        self._intervals: dict[str, list[Any]] = {"": [_new_hdr(scale), 0]} if interval else {}

    def add(self, value: float, count: int = 1) -> None:
        """Count ``value`` (in the base unit) ``count`` times."""
        stored = rounded(int(value * self.scale.per_unit))
        self.counts[stored] = self.counts.get(stored, 0) + count

    def add_all(self, values: Iterable[float]) -> None:
        """Count each of ``values`` once (in the base unit)."""
        counts, per_unit = self.counts, self.scale.per_unit
        for value in values:
            stored = int(value * per_unit)
            if stored >= SMALL_VALUES:
                shift = stored.bit_length() - KEPT_BITS
                stored = (stored >> shift) << shift
            counts[stored] = counts.get(stored, 0) + 1

    def snapshot(self) -> Histogram:
        """Every value so far."""
        self._fold()
        return self._copy(self._total, self._sum)

    def open_interval(self, reader: str) -> None:
        """Start intervals for ``reader`` (values from now on; see :meth:`interval_snapshot`)."""
        self._fold()
        self._intervals.setdefault(reader, [_new_hdr(self.scale), 0])

    def interval_snapshot(self, reader: str = "") -> Histogram:
        """The values since ``reader``'s previous interval snapshot (or its start); starts its
        next interval."""
        interval = self._intervals.get(reader)
        if interval is None:
            raise ValueError(f"this tally keeps no intervals for {reader!r}")
        self._fold()
        taken = self._copy(interval[0], interval[1])
        interval[0] = _new_hdr(self.scale)
        interval[1] = 0
        return taken

    def _fold(self) -> None:
        counts = self.counts
        if not counts:
            return
        top = self.scale.highest
        added = 0
        intervals = list(self._intervals.values())
        targets = [self._total, *(interval[0] for interval in intervals)]
        for stored, count in counts.items():
            kept = min(max(stored, 0), top)
            added += kept * count
            for hdr in targets:
                hdr.record_value(kept, count)
        counts.clear()
        self._sum += added
        for interval in intervals:
            interval[1] += added

    def _copy(self, hdr: Any, stored_sum: int) -> Histogram:
        copy = _new_hdr(self.scale)
        copy.add(hdr)
        return Histogram(self.scale, copy, stored_sum / self.scale.per_unit)


RATE_WINDOW: Final = 10.0
"""Seconds over which a :class:`RateMeter` averages."""


class RateMeter:
    """Events per second over a sliding window, in one-second buckets."""

    __slots__ = ("_buckets", "_clock", "_window")

    def __init__(self, clock: Clock, window: float = RATE_WINDOW) -> None:
        self._clock = clock
        self._window = window
        self._buckets: deque[list[float]] = deque()  # [second, count]

    def add(self, count: int) -> None:
        second = math.floor(self._clock.monotonic())
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += count
        else:
            buckets.append([second, count])
            self._trim()

    def _trim(self) -> None:
        horizon = self._clock.monotonic() - self._window
        while self._buckets and self._buckets[0][0] + 1 <= horizon:
            self._buckets.popleft()

    def rate(self) -> float:
        self._trim()
        return sum(count for _, count in self._buckets) / self._window


def on_loop(
    loop: asyncio.AbstractEventLoop | None, take: Callable[[], T], timeout: float | None
) -> T:
    """``take()`` run on ``loop``, from any thread: there when called on that loop (or when the
    loop is not running: nothing records then); else handed to the loop and waited for.

    Raises TimeoutError when the loop does not answer within ``timeout`` seconds.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or running is loop or loop.is_closed() or not loop.is_running():
        return take()

    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return  # the caller gave up
        try:
            future.set_result(take())
        except BaseException as exc:
            future.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:  # closed in the meantime
        raise TimeoutError("the event loop closed before it answered") from None
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the event loop did not answer within {timeout} s") from None
