"""The checks of ``bench/chaos_spark.py``: what the Spark pipeline wrote under faults, by id.

Pure functions over plain records (parsed by the soak from the file sink, the alerts stream,
Spark's checkpoint folders and event logs, and its own fault log), so that each can be fed a
planted violation in a unit test (``tests/unit/bench/test_chaos_spark_check.py``):

- :func:`exactly_once`: every event the producer had acknowledged is in the file sink once;
  none twice, none that was never sent;
- :func:`alerts_at_least_once`: every large order has an alert in the alerts stream; each
  extra copy is attributed to the fault whose window (start .. end + its recovery + ``slack``)
  holds its arrival, else it is unexplained: a batch caught by a fault is re-run before any
  batch planned after the fault commits, so its copies arrive before the recovery;
- :func:`stuck_batches`: micro-batches that took longer than the bound, not counting the time
  no driver ran the queries (a driver killed mid-batch leaves the batch to its successor,
  whose JVM and executors take a while to start);
- :func:`per_fault`: for each fault, the micro-batches in flight during it, the tasks that
  failed in its window (executor lost, exception) or died with a killed driver, and the time
  from its end until every query committed a batch planned after it (for a split or a merge:
  a batch that reads one of the new shards);
- :func:`check`: all of them, with the verdict.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

PROXY_FAULTS = frozenset({"kinesis_brownout", "kinesis_throttle", "s3_brownout", "s3_throttle"})
"""Faults the fault proxy injects: each must have failed at least one request."""
KILLS = frozenset({"executor_kill", "driver_kill"})
"""Faults aimed at a micro-batch in flight: each must have caught one, else it tested nothing."""
RESHARDS = frozenset({"split", "merge"})


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: ``kind``, its wall-clock window, what it hit (a PID, shard ids, ...), how
    many requests the proxy failed (proxy faults), and the new shards (split / merge)."""

    kind: str
    start: float
    end: float
    target: str = ""
    injected: int | None = None
    new_shards: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """One micro-batch of one query: planned (its offsets file written) at ``started``,
    committed at ``committed`` (None: never), reading ``reads`` (shard ids)."""

    query: str
    batch_id: int
    started: float
    committed: float | None
    reads: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Task:
    """One task attempt from a driver's event log; ``reason`` is Spark's end reason
    (``Success``, ``ExecutorLostFailure``, ``ExceptionFailure``, ...), None if it never ended
    (its driver died); ``driver`` the index of the driver run that launched it."""

    driver: int
    started: float
    finished: float | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class DriverRun:
    """One driver process: when it started and ended, and how (killed, failed, stopped);
    ``ready`` is when its queries were started (its JVM up, the checkpoints read)."""

    pid: int
    started: float
    ended: float | None
    how: str
    ready: float | None = None


@dataclass
class FaultOutcome:
    kind: str
    start: float
    end: float
    target: str
    requests_failed: int | None
    batches_in_flight: int
    tasks_failed: int
    tasks_lost_with_driver: int
    recovery: float | None
    recovery_by_query: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Report:
    events_acked: int = 0
    events_in_sink: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    alerts_expected: int = 0
    alerts_missing: int = 0
    alert_copies: int = 0
    alert_duplicates: int = 0
    alert_duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    batch_bound: float = 0.0
    longest_batch: float = 0.0
    stuck: list[str] = field(default_factory=list)
    per_fault: list[FaultOutcome] = field(default_factory=list)
    silent_faults: list[str] = field(default_factory=list)
    uninterrupting: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    recovery_max: float | None = None
    examples: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["passed"] = self.passed
        return raw


# --- the checks ------------------------------------------------------------------------------


def exactly_once(
    acked: Iterable[str], sink: Mapping[str, int], sent: Iterable[str] | None = None
) -> tuple[list[str], list[str], list[str]]:
    """(lost: acknowledged, not in the sink; in the sink more than once; in the sink, never
    sent), each sorted. ``sent`` (default: ``acked``) adds the events the producer gave up on,
    which may or may not have been written."""
    expected = set(acked)
    lost = sorted(expected - set(sink))
    twice = sorted(i for i, n in sink.items() if n > 1)
    unexpected = sorted(set(sink) - expected - set(sent or ()))
    return lost, twice, unexpected


def attribute(moment: float, faults: Sequence[Fault], slack: float) -> str:
    """The latest fault whose window, widened by ``slack`` after its end, holds ``moment``."""
    holding = [f for f in faults if f.start <= moment <= f.end + slack]
    return max(holding, key=lambda f: f.start).kind if holding else "unexplained"


def alerts_at_least_once(
    expected: Iterable[str],
    copies: Sequence[tuple[str, float]],
    faults: Sequence[Fault],
    slack: float,
) -> tuple[list[str], int, dict[str, int]]:
    """(missing, extra copies, extra copies by cause) of the alerts: ``copies`` are (order id,
    arrival time) of every alert read back; the first copy of each is the one that counts,
    every later copy is a duplicate attributed to a fault (or unexplained)."""
    seen: set[str] = set()
    causes: Counter[str] = Counter()
    for order_id, arrived in sorted(copies, key=lambda c: c[1]):
        if order_id in seen:
            causes[attribute(arrived, faults, slack)] += 1
        seen.add(order_id)
    missing = sorted(set(expected) - seen)
    return missing, sum(causes.values()), dict(sorted(causes.items()))


def _overlap(start: float, end: float, windows: Iterable[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in windows)


def serving(drivers: Sequence[DriverRun], tasks: Sequence[Task]) -> list[float | None]:
    """Per driver (by index): when its first task started, that is when it had an executor to
    run a batch on (None: it ran none)."""
    first: list[float | None] = [None] * len(drivers)
    for task in tasks:
        if 0 <= task.driver < len(drivers):
            known = first[task.driver]
            first[task.driver] = task.started if known is None else min(known, task.started)
    return first


def downtime(
    drivers: Sequence[DriverRun], until: float, tasks: Sequence[Task] = ()
) -> list[tuple[float, float]]:
    """The intervals with no driver running the queries: from each driver's end until the
    next one ran its first task (its executors up; a new application's executors are new
    JVMs), else until its queries were started, else its process start."""
    gaps = []
    firsts = serving(drivers, tasks)
    ordered = sorted(range(len(drivers)), key=lambda i: drivers[i].started)
    for before, after in itertools.pairwise(ordered):
        previous, following = drivers[before], drivers[after]
        back = next(t for t in (firsts[after], following.ready, following.started) if t is not None)
        if previous.ended is not None and back > previous.ended:
            gaps.append((previous.ended, back))
    last = drivers[ordered[-1]] if ordered else None
    if last is not None and last.ended is not None and last.ended < until:
        gaps.append((last.ended, until))
    return gaps


def batch_seconds(batch: Batch, gaps: Sequence[tuple[float, float]], until: float) -> float:
    """How long a batch ran (to its commit, or ``until`` if never committed), minus the time
    no driver ran the queries."""
    end = batch.committed if batch.committed is not None else until
    return max(0.0, end - batch.started - _overlap(batch.started, end, gaps))


def stuck_batches(
    batches: Sequence[Batch],
    drivers: Sequence[DriverRun],
    bound: float,
    until: float,
    tasks: Sequence[Task] = (),
    running_since: float | None = None,
) -> tuple[list[str], float]:
    """Batches that ran longer than ``bound`` seconds of driver time, and the longest time.
    Batches committed by ``running_since`` (when the soak saw every query running) are the
    queries' start-up, with the executors' first Python workers: bounded by the soak's start
    timeout, not here."""
    gaps = downtime(drivers, until, tasks)
    stuck, longest = [], 0.0
    for batch in batches:
        if (
            running_since is not None
            and batch.committed is not None
            and batch.committed <= running_since
        ):
            continue
        seconds = batch_seconds(batch, gaps, until)
        longest = max(longest, seconds)
        if seconds > bound:
            state = "committed" if batch.committed is not None else "never committed"
            stuck.append(f"{batch.query} batch {batch.batch_id}: {seconds:.1f} s ({state})")
    return stuck, round(longest, 2)


def recovery_of(
    fault: Fault, batches: Sequence[Batch], queries: Iterable[str]
) -> dict[str, float | None]:
    """Per query: seconds from the fault's end until it committed a batch planned after that
    end (for a split or merge: a batch reading a new shard); None if it never did."""
    found: dict[str, float | None] = {}
    for query in queries:
        times = [
            b.committed
            for b in batches
            if b.query == query
            and b.committed is not None
            and b.started >= fault.end
            and (fault.kind not in RESHARDS or set(b.reads) & set(fault.new_shards))
        ]
        found[query] = round(min(times) - fault.end, 2) if times else None
    return found


def per_fault(
    faults: Sequence[Fault],
    batches: Sequence[Batch],
    tasks: Sequence[Task],
    drivers: Sequence[DriverRun],
    slack: float,
) -> list[FaultOutcome]:
    queries = sorted({b.query for b in batches})
    outcomes = []
    starts = sorted(f.start for f in faults)
    for fault in faults:
        # A task failure counts for the fault until ``slack`` after its end or until the next
        # fault starts, whichever is first: never for two faults.
        later = [s for s in starts if s > fault.start]
        window_end = min([fault.end + slack, *later[:1]])
        in_flight = sum(
            1
            for b in batches
            if b.started <= fault.end and (b.committed is None or b.committed >= fault.start)
        )
        failed = sum(
            1
            for t in tasks
            if t.reason not in (None, "Success")
            and t.finished is not None
            and fault.start <= t.finished <= window_end
        )
        lost = 0
        if fault.kind == "driver_kill":
            # The tasks of the killed driver that never ended: it died with them running.
            killed = [i for i, d in enumerate(drivers) if str(d.pid) == fault.target]
            lost = sum(1 for t in tasks if t.driver in killed and t.finished is None)
        by_query = recovery_of(fault, batches, queries)
        times = list(by_query.values())
        recovery = None if not times or None in times else max(t for t in times if t is not None)
        outcomes.append(
            FaultOutcome(
                fault.kind,
                fault.start,
                fault.end,
                fault.target,
                fault.injected,
                in_flight,
                failed,
                lost,
                recovery,
                by_query,
            )
        )
    return outcomes


def check(
    *,
    acked: Iterable[str],
    sink: Mapping[str, int],
    sent: Iterable[str] | None = None,
    expected_alerts: Iterable[str],
    alert_copies: Sequence[tuple[str, float]],
    faults: Sequence[Fault],
    batches: Sequence[Batch],
    tasks: Sequence[Task],
    drivers: Sequence[DriverRun],
    batch_bound: float,
    until: float,
    running_since: float | None = None,
) -> Report:
    """Every check over one soak; ``until`` is when the soak stopped looking, ``running_since``
    when it saw every query running (the start-up's batches before are not held to the
    bound)."""
    report = Report(batch_bound=batch_bound)
    acked = list(acked)
    report.events_acked = len(set(acked))
    report.events_in_sink = sum(sink.values())
    lost, twice, unexpected = exactly_once(acked, sink, sent)
    report.lost, report.duplicated, report.unexpected = len(lost), len(twice), len(unexpected)
    report.per_fault = per_fault(faults, batches, tasks, drivers, batch_bound)
    # A fault's copies arrive while the batches it caught are re-run, before its recovery.
    reach = [
        replace(f, end=f.end + (o.recovery or 0.0))
        for f, o in zip(faults, report.per_fault, strict=True)
    ]
    expected = set(expected_alerts)
    missing, extra, causes = alerts_at_least_once(expected, alert_copies, reach, batch_bound)
    report.alerts_expected = len(expected)
    report.alerts_missing = len(missing)
    report.alert_copies = len(alert_copies)
    report.alert_duplicates = extra
    report.alert_duplicates_by_cause = causes
    report.batches = dict(sorted(Counter(b.query for b in batches).items()))
    report.stuck, report.longest_batch = stuck_batches(
        batches, drivers, batch_bound, until, tasks, running_since
    )
    for outcome in report.per_fault:
        name = f"{outcome.kind} at {outcome.start:.1f}"
        if outcome.kind in PROXY_FAULTS and not outcome.requests_failed:
            report.silent_faults.append(f"{name}: the proxy failed no request")
        if outcome.kind in KILLS and not outcome.batches_in_flight:
            report.uninterrupting.append(f"{name}: no micro-batch in flight")
        if outcome.recovery is None:
            report.stalled.append(f"{name}: a query committed nothing planned after it")
    recoveries = [o.recovery for o in report.per_fault if o.recovery is not None]
    report.recovery_max = max(recoveries) if recoveries else None
    report.examples = {
        "lost": lost[:5],
        "duplicated": twice[:5],
        "unexpected": unexpected[:5],
        "alerts_missing": missing[:5],
    }
    _verdict(report)
    return report


def _verdict(report: Report) -> None:
    problems = [
        (report.events_acked == 0, "no event was acknowledged"),
        (report.lost > 0, f"{report.lost} events lost"),
        (report.duplicated > 0, f"{report.duplicated} events twice in the file sink"),
        (report.unexpected > 0, f"{report.unexpected} events in the sink never sent"),
        (report.alerts_missing > 0, f"{report.alerts_missing} alerts missing"),
        (
            report.alert_duplicates_by_cause.get("unexplained", 0) > 0,
            f"{report.alert_duplicates_by_cause.get('unexplained', 0)} unexplained duplicate alerts",
        ),
        (bool(report.stuck), f"{len(report.stuck)} micro-batches past {report.batch_bound:g} s"),
        (bool(report.silent_faults), f"{len(report.silent_faults)} faults failed no request"),
        (bool(report.uninterrupting), f"{len(report.uninterrupting)} kills hit no batch"),
        (bool(report.stalled), f"{len(report.stalled)} faults with no recovery"),
    ]
    report.failures = [text for bad, text in problems if bad]
