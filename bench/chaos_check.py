"""The chaos soak's checker: what the handler-side logs say about a run.

Reads the producer's acknowledgements, every worker incarnation's handler log, the dead-letter
files and the harness's fault log (formats in ``chaos_roles.py`` and ``chaos.py``) and reports:

- ``lost``: records Kinesis acknowledged that no handler call finished (``ok``) and no dead
  letter holds (poison records must be in a dead letter);
- ``order_violations``: a record of a key whose first handler call started before the first
  successful call of the key's previous record had ended (replays after a failover go back,
  which is allowed; a record overtaking its predecessor is not);
- ``overlaps``: moments when handler calls of two different workers ran for the same shard at
  once (from start / end times); calls of a worker frozen by SIGSTOP are attributed to it;
- ``interleaved``: shards where two workers' stretches of activity (calls less than
  ``stretch_gap`` apart) cross in time: double ownership even when single calls do not touch;
- ``duplicates``: records handled ``ok`` more than once, each attributed to the fault that
  explains it (the earlier worker killed, stopped or restarted within seconds of the call, or
  a DynamoDB brownout during it: see ``_cause``); ``copies``: the same key/seq written twice
  to the stream by the producer;
- ``stuck_shards``: shards that hold acknowledged records never handled;
- ``unreconciled``: records the producer was given that Kinesis neither acknowledged nor
  reported failed (sent = acknowledged + failed), and acknowledgements of records never sent;
- per fault (``chaos_timeline``): handler calls in flight when it hit, requests the proxy
  failed, progress of every shard after it; two live owners of a shard by the lease events.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import chaos_timeline
from chaos_timeline import LeaseEvent, read_lease_events

__all__ = ["LeaseEvent", "read_lease_events"]

# A worker's handler calls under SIGSTOP end only after SIGCONT: give the frozen span this much
# margin when deciding that an overlap came from a frozen worker.
_FREEZE_MARGIN = 1.0
# How long after a handler call ends its idempotency completion may still be on its way to a
# loaded moto (normally milliseconds): a worker killed or stopped later than this after the
# call had already marked the record, so it cannot explain a second call.
_COMPLETION_LAG = 5.0
# A record handled this close before a DynamoDB brownout may have had its completion (with the
# guard) or its checkpoint (without: the checkpoint interval, 2 s, plus the write) refused by it.
_BROWNOUT_MARGIN = 3.0
#: A write of a lease unanswered this long when the lease ran out: the lease table was slow
#: (the soak's tables answer in milliseconds when the machine keeps up).
_SLOW_TABLE = 1.0
SLOW_TABLE = "slow_lease_table"
"""The cause of duplicates after a lease lapsed on a slow lease table (no fault injected)."""


@dataclass(frozen=True, slots=True)
class Acked:
    key: str
    seq: int
    shard: str
    sequence_number: str
    sub: int
    at: float


@dataclass(frozen=True, slots=True)
class Call:
    worker: str
    shard: str
    sequence_number: str
    sub: int
    key: str
    seq: str
    start: float
    end: float | None  # None: the worker died during the call
    outcome: str  # ok / raised / cut


@dataclass(frozen=True, slots=True)
class Fault:
    """One entry of the harness's fault log: ``kind`` on ``target`` from ``start`` to ``end``."""

    kind: str  # kill / stop / term / kinesis_brownout / throttle / dynamodb_brownout / ...
    target: str  # a worker id, a shard, or "" for everyone
    start: float
    end: float
    pid: int | None = None  # the process signalled (kill / stop / term)
    injected: int | None = None  # requests the fault proxy failed (proxy faults only)


@dataclass(frozen=True, slots=True)
class Sent:
    """What the producer was given and what became of it, by (key, seq)."""

    sent: frozenset[tuple[str, int]]
    acked: frozenset[tuple[str, int]]
    failed: frozenset[tuple[str, int]]


@dataclass
class Report:
    written: int = 0
    producer_gave_up: int = 0
    handled: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    poison_written: int = 0
    poison_dead_lettered: int = 0
    dead_letters_unexpected: int = 0
    dead_letters_repeated: int = 0
    order_violations: int = 0
    order_examples: list[str] = field(default_factory=list)
    overlaps: int = 0
    overlaps_frozen: int = 0
    overlap_examples: list[str] = field(default_factory=list)
    interleaved: int = 0
    interleaved_examples: list[str] = field(default_factory=list)
    duplicates: int = 0
    duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    duplicate_examples: list[str] = field(default_factory=list)
    copies: int = 0
    replay_depth_max: dict[str, float] = field(default_factory=dict)
    frozen_calls: list[dict[str, Any]] = field(default_factory=list)
    stuck_shards: list[str] = field(default_factory=list)
    calls: int = 0
    workers: int = 0
    sent: int = 0
    unreconciled: int = 0
    acked_not_sent: int = 0
    reconcile_examples: list[str] = field(default_factory=list)
    per_fault: list[dict[str, Any]] = field(default_factory=list)
    interrupted_by_kind: dict[str, int] = field(default_factory=dict)
    uninterrupting: list[str] = field(default_factory=list)
    silent_faults: list[str] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)
    progress_p50: float | None = None
    progress_max: float | None = None
    progress_goal: float | None = None
    stalled: list[str] = field(default_factory=list)
    caught_up_after: float | None = None
    last_fault_end: float | None = None
    latency_after_faults: dict[str, Any] | None = None
    lease_intervals: int = 0
    double_owners: int = 0
    double_owner_examples: list[str] = field(default_factory=list)
    handovers: int = 0
    handover_max: float = 0.0
    stale_after_stop: list[float] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """Every check that failed, by name (empty: the run passed)."""
        failed = {
            "lost": self.lost,
            "order_violations": self.order_violations,
            "overlaps": self.overlaps,
            "interleaved": self.interleaved,
            "stuck_shards": len(self.stuck_shards),
            "unexplained_duplicates": self.duplicates_by_cause.get("unexplained", 0),
            "unreconciled": self.unreconciled + self.acked_not_sent,
            "uninterrupting": len(self.uninterrupting),
            "silent_faults": len(self.silent_faults),
            "stalled": len(self.stalled),
            "double_owners": self.double_owners,
            "not_caught_up": int(self.last_fault_end is not None and self.caught_up_after is None),
        }
        return sorted(name for name, count in failed.items() if count)

    @property
    def progress_goal_met(self) -> bool | None:
        """Whether every shard handled again within the goal after every fault (None: no
        goal or no fault). A latency goal, reported apart from the correctness checks: a
        loaded machine may miss it without anything being lost or run twice."""
        if self.progress_goal is None or self.progress_max is None:
            return None
        return self.progress_max <= self.progress_goal

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        data["failures"] = self.failures
        data["progress_goal_met"] = self.progress_goal_met
        return data


# --- reading --------------------------------------------------------------------------------


def read_produced(path: Path) -> tuple[list[Acked], list[tuple[str, str, str]], int]:
    """Acknowledged records, poison records (key, kind, shard), records given up."""
    acked: list[Acked] = []
    poison: list[tuple[str, str, str]] = []
    gave_up = 0
    for line in _lines(path):
        f = line.split("\t")
        if f[0] == "A" and len(f) == 7:
            acked.append(Acked(f[1], int(f[2]), f[3], f[4], int(f[5]), float(f[6])))
        elif f[0] == "P" and len(f) == 6:
            poison.append((f[1], f[2], f[3]))
        elif f[0] == "F":
            gave_up += 1
    return acked, poison, gave_up


def read_sent(path: Path) -> Sent:
    """The producer's ``W`` (given to it), ``A`` (acknowledged) and ``F`` (failed) records."""
    sent: set[tuple[str, int]] = set()
    acked: set[tuple[str, int]] = set()
    failed: set[tuple[str, int]] = set()
    for line in _lines(path):
        f = line.split("\t")
        if len(f) < 4 or not f[2].isdigit() or f[1].startswith(_POISON_PREFIXES):
            continue
        {"W": sent, "A": acked, "F": failed}.get(f[0], set()).add((f[1], int(f[2])))
    return Sent(frozenset(sent), frozenset(acked), frozenset(failed))


_POISON_PREFIXES = ("poison-", "undecodable-", "malformed-")


def read_calls(paths: Iterable[Path]) -> list[Call]:
    """Handler calls of every worker file; a start without an end is a call cut by a kill."""
    calls: list[Call] = []
    for path in paths:
        open_calls: dict[tuple[str, str, str, str], tuple[float, str, str]] = {}
        ordered: list[tuple[tuple[str, str, str, str], float, float | None, str, str, str]] = []
        for line in _lines(path):
            f = line.split("\t")
            if f[0] == "S" and len(f) == 8:
                ident = (f[1], f[2], f[3], f[4])
                open_calls[ident] = (float(f[7]), f[5], f[6])
            elif f[0] == "E" and len(f) == 9:
                ident = (f[1], f[2], f[3], f[4])
                begun = open_calls.pop(ident, None)
                if begun is not None:
                    ordered.append((ident, begun[0], float(f[7]), f[8], begun[1], begun[2]))
        for ident, (start, key, seq) in open_calls.items():
            ordered.append((ident, start, None, "cut", key, seq))
        for (worker, shard, number, sub), start, end, outcome, key, seq in ordered:
            calls.append(Call(worker, shard, number, int(sub), key, seq, start, end, outcome))
    return calls


def read_dead_letter_keys(paths: Iterable[Path]) -> Counter[str]:
    """Partition keys of every dead letter in the JSON-lines files (a torn last line is skipped)."""
    keys: Counter[str] = Counter()
    for path in paths:
        for line in _lines(path):
            try:
                keys[json.loads(line)["partition_key"]] += 1
            except (ValueError, KeyError):
                continue
    return keys


def read_faults(path: Path) -> list[Fault]:
    faults = []
    for line in _lines(path):
        f = line.split("\t")
        if len(f) >= 4:
            pid = int(f[4]) if len(f) > 4 and f[4].isdigit() else None
            injected = int(f[5]) if len(f) > 5 and f[5].isdigit() else None
            faults.append(Fault(f[0], f[1], float(f[2]), float(f[3]), pid, injected))
    return faults


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    # A worker killed mid-write leaves at most a torn last line: drop lines without a newline.
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line]


# --- checking -------------------------------------------------------------------------------


def check(
    acked: Sequence[Acked],
    poison: Sequence[tuple[str, str, str]],
    gave_up: int,
    calls: Sequence[Call],
    dead_letter_keys: Counter[str],
    faults: Sequence[Fault],
    *,
    lease_events: Sequence[LeaseEvent] = (),
    sent: Sent | None = None,
    failover: float | None = None,
    progress_slack: float = 5.0,
    stretch_gap: float = 2.0,
    examples: int = 5,
    guarded: bool = True,
) -> Report:
    """Every check over one run's logs. ``sent`` (the producer's own log) turns on the
    reconciliation, ``failover`` the progress goal (``failover + progress_slack`` seconds).
    ``guarded``: the workers ran the idempotency guard (without it, a record runs again when
    no checkpoint covered it, and the checkpoints in ``lease_events`` date that)."""
    report = Report(written=len(acked), producer_gave_up=gave_up, calls=len(calls))
    report.workers = len({c.worker for c in calls})
    report.poison_written = len(poison)
    _losses(report, acked, poison, calls, dead_letter_keys, examples)
    _order(report, acked, calls, examples)
    _overlaps(report, calls, faults, examples)
    _interleaving(report, calls, stretch_gap, examples)
    written = None if guarded else checkpoints_by_shard(lease_events)
    lapses = slow_table_lapses(lease_events)
    _duplicates(report, acked, calls, faults, examples, written, lapses)
    _frozen_calls(report, calls, faults, lease_events, failover)
    if sent is not None:
        _reconcile(report, sent, examples)
    _faults(report, acked, calls, faults, failover, progress_slack)
    if lease_events:
        end = max([e.at for e in lease_events] + [c.start for c in calls])
        owners = chaos_timeline.ownership(lease_events, faults, end, examples)
        report.lease_intervals = owners.intervals
        report.double_owners = owners.double_owners
        report.double_owner_examples = owners.examples
        report.handovers = owners.handovers
        report.handover_max = owners.handover_max
        report.stale_after_stop = owners.stale_after_stop
    return report


def _reconcile(report: Report, sent: Sent, examples: int) -> None:
    """sent = acknowledged + failed, and nothing acknowledged that was not sent."""
    report.sent = len(sent.sent)
    missing = sent.sent - sent.acked - sent.failed
    extra = (sent.acked | sent.failed) - sent.sent
    report.unreconciled = len(missing)
    report.acked_not_sent = len(extra)
    for key, seq in sorted(missing)[:examples]:
        report.reconcile_examples.append(f"{key}:{seq} sent, neither acknowledged nor failed")
    for key, seq in sorted(extra)[:examples]:
        report.reconcile_examples.append(f"{key}:{seq} acknowledged or failed, never sent")


def _faults(
    report: Report,
    acked: Sequence[Acked],
    calls: Sequence[Call],
    faults: Sequence[Fault],
    failover: float | None,
    slack: float,
) -> None:
    report.per_fault = chaos_timeline.interruptions(calls, faults)
    by_kind: Counter[str] = Counter()
    for p in report.per_fault:
        by_kind[p["kind"]] += p["interrupted"]
    report.interrupted_by_kind = dict(by_kind)
    report.uninterrupting = chaos_timeline.uninterrupting(report.per_fault)
    report.silent_faults = chaos_timeline.silent_faults(faults)
    progress = chaos_timeline.progress(acked, calls, faults)
    report.progress = [p.summary() for p in progress]
    delays = [d for p in progress for d in p.delays.values()]
    worst = [max(p.delays.values()) for p in progress if p.delays]
    if delays:
        report.progress_p50 = round(statistics.median(delays), 2)
        report.progress_max = round(max(worst), 2)
    report.stalled = sorted(
        {f"{p.kind}@{p.reference:.1f}:{s}" for p in progress for s in p.stalled}
    )
    if failover is not None:
        # The bound the design gives after a kill -9: the survivors see the dead worker's
        # leases expire failover_time after the last renewal they saw (renewals every
        # failover/3, seen within one pick-up poll, 1 s here), take them at once (each its
        # part, beyond its share if need be), and the shard's first record follows the
        # checkpoint read and first GetRecords: about failover + 2 s, inside the goal's 5 s.
        report.progress_goal = failover + slack
    caught = chaos_timeline.catch_up(acked, calls, faults)
    report.last_fault_end = caught["last_fault_end"]
    report.caught_up_after = caught["caught_up_after"]
    report.latency_after_faults = caught["latency_after_faults"]


def _frozen_calls(
    report: Report,
    calls: Sequence[Call],
    faults: Sequence[Fault],
    lease_events: Sequence[LeaseEvent],
    failover: float | None,
) -> None:
    """Calls a SIGSTOP froze mid-way, and how long each outlived its lease: from the moment
    another worker took the shard (by the lease events; else the stop plus the failover
    time) to the call's end."""
    for c in calls:
        if c.end is None:
            continue
        for f in faults:
            if f.kind != "stop" or f.target != c.worker or not (c.start <= f.start < c.end):
                continue
            taken = chaos_timeline.lease_taken_at(lease_events, c.shard, c.worker, f.start)
            if taken == float("inf"):
                taken = f.start + (failover or 0.0)
            report.frozen_calls.append(
                {
                    "worker": c.worker,
                    "shard": c.shard,
                    "record": f"{c.key}:{c.seq}",
                    "frozen_for": round(c.end - c.start, 3),
                    "outlived_lease": round(max(0.0, c.end - taken), 3),
                }
            )


def _losses(
    report: Report,
    acked: Sequence[Acked],
    poison: Sequence[tuple[str, str, str]],
    calls: Sequence[Call],
    dead_letter_keys: Counter[str],
    examples: int,
) -> None:
    done = {(c.key, c.seq) for c in calls if c.outcome == "ok"}
    report.handled = len({(a.key, a.seq) for a in acked} & {(k, int(s)) for k, s in _numeric(done)})
    stuck: set[str] = set()
    for a in acked:
        if (a.key, str(a.seq)) not in done:
            report.lost += 1
            stuck.add(a.shard)
            if len(report.lost_examples) < examples:
                report.lost_examples.append(f"{a.key}:{a.seq} on {a.shard}")
    poison_keys = {key for key, _, _ in poison}
    for key, _, shard in poison:
        if dead_letter_keys[key] == 0:
            report.lost += 1
            stuck.add(shard)
            if len(report.lost_examples) < examples:
                report.lost_examples.append(f"poison {key} on {shard} not dead-lettered")
    report.poison_dead_lettered = sum(1 for key in poison_keys if dead_letter_keys[key])
    report.dead_letters_repeated = sum(n - 1 for key, n in dead_letter_keys.items() if n > 1)
    report.dead_letters_unexpected = sum(
        n for key, n in dead_letter_keys.items() if key not in poison_keys
    )
    report.stuck_shards = sorted(stuck)


def _numeric(pairs: Iterable[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    return ((k, s) for k, s in pairs if s.isdigit())


def _order(report: Report, acked: Sequence[Acked], calls: Sequence[Call], examples: int) -> None:
    first_start: dict[tuple[str, str], float] = {}
    first_end: dict[tuple[str, str], float] = {}
    for c in calls:
        ident = (c.key, c.seq)
        first_start[ident] = min(first_start.get(ident, c.start), c.start)
        if c.outcome == "ok" and c.end is not None:
            first_end[ident] = min(first_end.get(ident, c.end), c.end)
    seqs: dict[str, set[int]] = defaultdict(set)
    for a in acked:
        seqs[a.key].add(a.seq)
    for key, numbers in seqs.items():
        ordered = sorted(numbers)
        for before, after in itertools.pairwise(ordered):
            ended = first_end.get((key, str(before)))
            started = first_start.get((key, str(after)))
            if ended is None or started is None:
                continue  # a loss, counted there
            if started < ended:
                report.order_violations += 1
                if len(report.order_examples) < examples:
                    report.order_examples.append(
                        f"{key}:{after} started {ended - started:.3f}s before {key}:{before} ended"
                    )


def _frozen(faults: Sequence[Fault], worker: str, start: float, end: float) -> bool:
    """Whether a call of ``worker`` from ``start`` to ``end`` was caught by a SIGSTOP: it began
    before the stop and was still running when it came (a call begun after SIGCONT is not)."""
    return any(
        f.kind == "stop" and f.target == worker and start <= f.start + 0.05 and end >= f.start
        for f in faults
    )


def _overlaps(
    report: Report, calls: Sequence[Call], faults: Sequence[Fault], examples: int
) -> None:
    """Count overlapping moments per shard: a sweep over call intervals of distinct workers."""
    death = _deaths(calls, faults)
    by_shard: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for c in calls:
        end = c.end if c.end is not None else death.get(c.worker, c.start)
        by_shard[c.shard].append((c.start, end, c.worker))
    for shard, spans in by_shard.items():
        spans.sort()
        active: list[tuple[float, float, str]] = []
        in_overlap = False
        for start, end, worker in spans:
            active = [s for s in active if s[1] > start]
            others = [s for s in active if s[2] != worker]
            if others and not in_overlap:
                in_overlap = True
                other = others[0]
                frozen = _frozen(faults, other[2], other[0], other[1]) or _frozen(
                    faults, worker, start, end
                )
                if frozen:
                    report.overlaps_frozen += 1
                else:
                    report.overlaps += 1
                if len(report.overlap_examples) < examples:
                    report.overlap_examples.append(
                        f"{shard}: {other[2]} [{other[0]:.3f}, {other[1]:.3f}] and {worker} "
                        f"[{start:.3f}, {end:.3f}]{' (frozen worker)' if frozen else ''}"
                    )
            elif not others:
                in_overlap = False
            active.append((start, end, worker))


def _deaths(calls: Sequence[Call], faults: Sequence[Fault]) -> dict[str, float]:
    """When each killed worker died (for calls it never finished)."""
    return {f.target: f.start for f in faults if f.kind == "kill"}


def _interleaving(report: Report, calls: Sequence[Call], gap: float, examples: int) -> None:
    """Shards where stretches of activity of two workers cross in time."""
    by_shard: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in calls:
        by_shard[c.shard][c.worker].append(c.start)
    for shard, workers in by_shard.items():
        stretches: list[tuple[float, float, str]] = []
        for worker, times in workers.items():
            times.sort()
            first = last = times[0]
            for t in times[1:]:
                if t - last > gap:
                    stretches.append((first, last, worker))
                    first = t
                last = t
            stretches.append((first, last, worker))
        stretches.sort()
        for (a_start, a_end, a_worker), (b_start, b_end, b_worker) in itertools.pairwise(stretches):
            if a_worker != b_worker and b_start < a_end:
                report.interleaved += 1
                if len(report.interleaved_examples) < examples:
                    report.interleaved_examples.append(
                        f"{shard}: {a_worker} {a_start:.3f}..{a_end:.3f} crosses "
                        f"{b_worker} {b_start:.3f}..{b_end:.3f}"
                    )


def _duplicates(
    report: Report,
    acked: Sequence[Acked],
    calls: Sequence[Call],
    faults: Sequence[Fault],
    examples: int,
    written: Mapping[str, list[tuple[float, tuple[int, int]]]] | None = None,
    lapses: Mapping[tuple[str, str], list[float]] | None = None,
) -> None:
    per_record: dict[tuple[str, str], list[Call]] = defaultdict(list)
    for c in calls:
        if c.outcome == "ok" and c.seq.isdigit():
            per_record[(c.key, c.seq)].append(c)
    positions: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
    for a in acked:
        positions[(a.key, a.seq)].add((a.sequence_number, a.sub))
    report.copies = sum(1 for places in positions.values() if len(places) > 1)
    causes: Counter[str] = Counter()
    for (key, seq), handled in per_record.items():
        if len(handled) < 2:
            continue
        handled.sort(key=lambda c: c.start)
        for earlier, later in itertools.pairwise(handled):
            report.duplicates += 1
            cause = _cause(earlier, later, faults, written, lapses)
            causes[cause] += 1
            depth = _replay_depth(earlier, later, faults, cause)
            if depth is not None:
                report.replay_depth_max[cause] = round(
                    max(report.replay_depth_max.get(cause, 0.0), depth), 3
                )
            if cause == "unexplained" and len(report.duplicate_examples) < examples:
                report.duplicate_examples.append(
                    f"{key}:{seq} by {earlier.worker} at {earlier.start:.3f} and {later.worker} "
                    f"at {later.start:.3f}"
                )
    report.duplicates_by_cause = dict(causes)


def _replay_depth(earlier: Call, later: Call, faults: Sequence[Fault], cause: str) -> float | None:
    """How long before its fault the replayed record had first been handled: the stretch of
    work since the last checkpoint, bounded by the checkpoint interval (plus its write)."""
    end = earlier.end if earlier.end is not None else earlier.start
    starts = [
        f.start
        for f in faults
        if f.kind == cause and f.start <= later.start and (f.target in ("", earlier.worker))
    ]
    return max(0.0, max(starts) - end) if starts else None


_COVERS_ALL = (1 << 200, 0)  # SHARD_END: every record of the shard is done


def checkpoints_by_shard(
    lease_events: Sequence[LeaseEvent],
) -> dict[str, list[tuple[float, tuple[int, int]]]]:
    """Per shard, the checkpoints the workers wrote (``CheckpointWritten`` lines whose detail
    is ``sequence:sub``), as (when, position), in time order."""
    written: dict[str, list[tuple[float, tuple[int, int]]]] = defaultdict(list)
    for e in lease_events:
        if e.event != "CheckpointWritten" or ":" not in e.detail:
            continue
        number, _, sub = e.detail.rpartition(":")
        if number == "SHARD_END":
            written[e.shard].append((e.at, _COVERS_ALL))
        elif number.isdigit() and sub.isdigit():
            written[e.shard].append((e.at, (int(number), int(sub))))
    return dict(written)


def _covered(
    written: Mapping[str, list[tuple[float, tuple[int, int]]]], call: Call, by: float
) -> bool:
    """Whether a checkpoint written by ``by`` covered the record of ``call``."""
    if not call.sequence_number.isdigit():
        return False
    position = (int(call.sequence_number), call.sub)
    return any(at <= by and mark >= position for at, mark in written.get(call.shard, ()))


def slow_table_lapses(lease_events: Sequence[LeaseEvent]) -> dict[tuple[str, str], list[float]]:
    """When each (worker, shard) lease lapsed because the lease table did not answer in time
    (:meth:`LeaseEvent.slow_table`)."""
    lapses: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in lease_events:
        if e.slow_table(_SLOW_TABLE):
            lapses[(e.worker, e.shard)].append(e.at)
    return dict(lapses)


def _cause(
    earlier: Call,
    later: Call,
    faults: Sequence[Fault],
    written: Mapping[str, list[tuple[float, tuple[int, int]]]] | None = None,
    lapses: Mapping[tuple[str, str], list[float]] | None = None,
) -> str:
    """The fault that explains handling a record twice, or ``unexplained``.

    With the idempotency guard a record runs again only when its claim was left open: its
    handler ended (``ok``) but the completion never reached the table, so the claim ran out
    after its TTL and the shard's next owner ran the record again. Two faults do that:

    - the earlier worker was killed, stopped or shut down while the completion was on its
      way: the call ended at most ``_COMPLETION_LAG`` before the fault began, or during it
      (a call frozen by SIGSTOP ends after SIGCONT, hence ``_FREEZE_MARGIN``);
    - a DynamoDB brownout refused the completion for longer than the claim's TTL: the call
      ended inside the brownout (``_BROWNOUT_MARGIN`` either side).

    Without the guard (``written``: the checkpoints per shard), a brownout also explains a
    record whose call ended earlier, if no checkpoint written before the brownout began
    covered it before the later call began: a checkpoint late on a loaded machine was then
    refused by the brownout, and the lease's next owner began before the record, as
    at-least-once allows. A record a checkpoint had covered is never explained by it.

    The later call must begin after the fault began. One more cause is not injected: the
    earlier worker's lease of the shard ran out between the two calls while a write of it
    had been unanswered for ``_SLOW_TABLE`` seconds or its renewal had failed (the worker says
    so in its LeaseLost event): a ``slow lease table``, as on a machine too loaded to serve
    it, which costs replays, never overlap (checked apart), and only if no checkpoint had
    covered the record. Any other duplicate (a lease lapse with no write unanswered, a
    re-take by the same worker) is ``unexplained``: a bug. The same key/seq at two stream
    positions is a ``producer copy``.
    """
    if (earlier.sequence_number, earlier.sub) != (later.sequence_number, later.sub):
        return "producer copy"
    end = earlier.end if earlier.end is not None else earlier.start
    for f in faults:
        if (
            f.target == earlier.worker
            and f.kind in ("kill", "stop", "term")
            and f.start - _COMPLETION_LAG <= end <= f.end + _FREEZE_MARGIN
            and f.start <= later.start
        ):
            return f.kind
    for f in faults:
        if f.kind != "dynamodb_brownout" or later.start < f.start:
            continue
        if f.start - _BROWNOUT_MARGIN <= end <= f.end + _BROWNOUT_MARGIN:
            return f.kind
        if (
            written is not None
            and end <= f.start
            # Dated by the write's event (after it landed): one on record before the later
            # call began had landed before the next owner's take, which would have read it.
            and not _covered(written, earlier, later.start)
        ):
            return f.kind
    for at in (lapses or {}).get((earlier.worker, earlier.shard), ()):
        if earlier.start <= at <= later.start and not (
            written is not None and _covered(written, earlier, later.start)
        ):
            return SLOW_TABLE
    return "unexplained"
