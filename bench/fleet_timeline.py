"""Where a planned move's pause goes: each shard's handoff, step by step, from the workers'
logs and the records they handled (bench/fleet.py's per-shard timelines).

A shard handed from one worker to another in a planned move passes these steps, each logged
with a wall time by the worker that does it (``%(created).3f`` in the workers' log files):

    last record handled by the old owner
    -> "handing lease K over to W"            the old owner's handoff write landed (begin)
    -> "lease K handed over to W ..."         drained, final checkpoint + handover written
    -> "claimed lease K (handoff)"            the new owner saw it (pick-up) and renewed it
    -> "shard K (...): resuming after ..."    its reader starts (checkpoint from the lease)
    -> first record handled by the new owner  GetShardIterator, GetRecords, the handler

The last stage is split in two by the time the new owner's first record was written: a reader
that starts before the next record exists waits for the producer (at 2 records/s up to 0.5 s),
which is the rate, not the handoff. A pause (the gap between the two records) is the sum of
the stages;
:func:`moves` finds every such move in a window, :func:`stage_summary` says which stage the
pause went to, on the median move and on the shards with the longest gaps.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Handled = tuple[str, str, str, float]
"""One record handled: worker, shard, record id, wall time (as fleet_kit)."""

_LINE = re.compile(r"^(\d+\.\d+) shardflow\.\S+ (.*)$")
_EVENTS = (
    ("begun", re.compile(r"^handing lease (\S+) over to (\S+)$")),
    ("handed", re.compile(r"^lease (\S+) handed over to (\S+)")),
    ("claimed", re.compile(r"^claimed lease (\S+) \(handoff[;)]")),
    ("reader", re.compile(r"^shard (\S+) \(stream [^)]*\): resuming after checkpoint")),
)
_WRITE = re.compile(r"write (\d+\.\d+) s\)$")
"""The handover's and the claim's own write time, as the workers log them (older logs: none)."""
STAGES = ("begun", "handed", "claimed", "reader", "no_record", "first")
"""The points of a move after the old owner's last record, in order."""
STAGE_TITLES = {
    "begun": "last record -> handoff begun",
    "handed": "begun -> drained + handed over",
    "claimed": "handed over -> claimed by the new owner",
    "reader": "claimed -> reader started",
    "no_record": "waiting for the next record to be written",
    "first": "reader started (or record written) -> first record handled",
}


@dataclass(frozen=True)
class LogEvent:
    at: float
    worker: str
    kind: str
    """"begun", "handed" (by the old owner), "claimed", "reader" (by the new owner)."""
    shard: str
    write: float | None = None
    """"handed", "claimed": how long the lease-table write itself took (None: not logged)."""


@dataclass
class Move:
    """One shard passing from ``old`` to ``new`` (see the module doc): wall times."""

    shard: str
    old: str
    new: str
    last: float
    first: float
    written: float | None = None
    """When the new owner's first record was written (None: not known)."""
    begun: float | None = None
    handed: float | None = None
    claimed: float | None = None
    reader: float | None = None
    handover_write: float | None = None
    """Of the "handed" stage, the handover write itself (the rest: the drain)."""
    claim_write: float | None = None
    """Of the "claimed" stage, the claim write itself (the rest: pick-up seeing it)."""

    @property
    def gap(self) -> float:
        return self.first - self.last

    def stages(self) -> dict[str, float | None]:
        """Seconds spent in each stage (None where a point was not logged)."""
        points: list[tuple[str, float | None]] = [
            ("begun", self.begun),
            ("handed", self.handed),
            ("claimed", self.claimed),
            ("reader", self.reader),
            ("first", self.first),
        ]
        out: dict[str, float | None] = {}
        previous: float | None = self.last
        for name, at in points:
            if name == "first" and previous is not None and self.written is not None:
                # Reader up before the record existed: that wait is the producer's rate.
                waited = max(0.0, min(self.written, at) - previous)
                out["no_record"] = round(waited, 3)
                previous += waited
            elif name == "first":
                out["no_record"] = None
            out[name] = round(at - previous, 3) if at is not None and previous is not None else None
            previous = at if at is not None else None
        return {name: out[name] for name in STAGES}

    @property
    def first_delay(self) -> float | None:
        """How long the new owner's first record waited to be handled after it was written."""
        return None if self.written is None else self.first - self.written


def read_events(logs: Mapping[str, Path]) -> list[LogEvent]:
    """The handoff points logged by every worker (name -> its log file)."""
    events = []
    for worker, path in logs.items():
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            match = _LINE.match(line)
            if match is None:
                continue
            for kind, pattern in _EVENTS:
                found = pattern.match(match.group(2))
                if found is not None:
                    took = _WRITE.search(match.group(2))
                    write = float(took.group(1)) if took is not None else None
                    events.append(
                        LogEvent(float(match.group(1)), worker, kind, found.group(1), write)
                    )
                    break
    events.sort(key=lambda event: event.at)
    return events


def moves(
    rows: Iterable[Handled],
    events: Iterable[LogEvent],
    start: float,
    end: float,
    written: Mapping[str, float] | None = None,
) -> list[Move]:
    """Every change of the worker handling a shard whose first record by the new worker falls
    in ``[start, end]``, with the logged points between the two records (``written``: record
    id -> when it was written)."""
    by_shard: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    for worker, shard, record_id, at in rows:
        by_shard[shard].append((at, worker, record_id))
    logged: dict[str, list[LogEvent]] = defaultdict(list)
    for event in events:
        logged[event.shard].append(event)
    found: list[Move] = []
    for shard, handled in by_shard.items():
        handled.sort()
        for (last, old, _), (first, new, record_id) in itertools.pairwise(handled):
            if old == new or not start <= first <= end:
                continue
            sent = written.get(record_id) if written is not None else None
            move = Move(shard, old, new, last, first, sent)
            for event in logged.get(shard, []):
                # The points of this move: after the old owner's last-but-one record at the
                # earliest (a handoff may begin while its last record is being handled).
                if not last - 5.0 <= event.at <= first:
                    continue
                owner = old if event.kind in ("begun", "handed") else new
                if event.worker == owner and getattr(move, event.kind) is None:
                    setattr(move, event.kind, event.at)
                    if event.kind == "handed":
                        move.handover_write = event.write
                    elif event.kind == "claimed":
                        move.claim_write = event.write
            found.append(move)
    return found


def stage_summary(found: list[Move], worst: int = 5) -> dict[str, Any]:
    """Per stage, the median and max seconds over the moves; the worst moves by gap, each
    with its stages."""
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for move in found:
        for name, seconds in move.stages().items():
            if seconds is not None:
                stages[name].append(seconds)
    ranked = sorted(found, key=lambda move: move.gap, reverse=True)
    delays = [m.first_delay for m in found if m.first_delay is not None]
    writes = {
        name: [w for m in found if (w := getattr(m, f"{name}_write")) is not None]
        for name in ("handover", "claim")
    }
    return {
        "moves": len(found),
        "gap_median": round(statistics.median(m.gap for m in found), 3) if found else None,
        "first_delay_median": round(statistics.median(delays), 3) if delays else None,
        "first_delay_max": round(max(delays), 3) if delays else None,
        "stages": {
            name: {
                "median": round(statistics.median(values), 3) if values else None,
                "max": round(max(values), 3) if values else None,
                "logged": len(values),
            }
            for name, values in stages.items()
        },
        "writes": {
            name: {
                "median": round(statistics.median(values), 3) if values else None,
                "max": round(max(values), 3) if values else None,
            }
            for name, values in writes.items()
        },
        "worst": [
            {
                "shard": move.shard,
                "old": move.old,
                "new": move.new,
                "gap": round(move.gap, 3),
                "first_delay": round(move.first_delay, 3) if move.first_delay is not None else None,
                "stages": move.stages(),
                "handover_write": move.handover_write,
                "claim_write": move.claim_write,
            }
            for move in ranked[:worst]
        ],
    }


def describe(summary: dict[str, Any]) -> list[str]:
    """Lines for the bench's output: the median move's stages, then the worst moves."""
    if not summary["moves"]:
        return ["no shard changed hands"]
    medians = ", ".join(
        f"{STAGE_TITLES[name]} {fmt(values['median'])} (max {fmt(values['max'])})"
        for name, values in summary["stages"].items()
    )
    lines = [
        f"{summary['moves']} moves, gap median {fmt(summary['gap_median'])}, the new owner's "
        f"first record waited {fmt(summary['first_delay_median'])} (max "
        f"{fmt(summary['first_delay_max'])}): {medians}{writes_text(summary, fmt)}"
    ]
    for move in summary["worst"]:
        stages = ", ".join(f"{name} {fmt(value)}" for name, value in move["stages"].items())
        lines.append(
            f"  {move['shard'][-4:]} {move['old']} -> {move['new']}: gap "
            f"{fmt(move['gap'])} = {stages}; first record waited {fmt(move['first_delay'])}"
            f"; handover write {fmt(move.get('handover_write'))}, claim write "
            f"{fmt(move.get('claim_write'))}"
        )
    return lines


def writes_text(summary: dict[str, Any], form: Callable[[float | None], str]) -> str:
    """The handover's and the claim's own writes (median, max), where the logs gave them."""
    writes = summary.get("writes") or {}
    parts = [
        f"{name} write {form(values['median'])} (max {form(values['max'])})"
        for name, values in writes.items()
        if values.get("median") is not None
    ]
    return f"; of which the {' and the '.join(parts)}" if parts else ""


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def as_dicts(found: list[Move]) -> list[dict[str, Any]]:
    return [asdict(move) | {"gap": round(move.gap, 3)} for move in found]


# --- pauses of shards that did not move ---------------------------------------------------------

_LATE = re.compile(r"^(\d+\.\d+) bench\.loop loop late by (\d+\.\d+) s \(asked at (\d+\.\d+)\)$")


@dataclass(frozen=True)
class Stay:
    """A pause of a shard between two records handled by the same worker: what the producer
    left between them, and how late that worker's event loop ran meanwhile."""

    shard: str
    worker: str
    last: float
    first: float
    writer_gap: float | None
    """Seconds between the two records' send times (None: not known)."""
    loop_late: float
    """The longest lateness of the worker's loop logged within the pause (0: none over the
    probe's threshold)."""
    slow_put: float
    """The longest PutRecords call of the producer that overlapped the pause."""

    @property
    def gap(self) -> float:
        return self.first - self.last

    @property
    def beyond_writer(self) -> float | None:
        """How much longer the pause was than the producer's own gap between the records."""
        return None if self.writer_gap is None else round(self.gap - self.writer_gap, 3)


def read_loop_late(logs: Mapping[str, Path]) -> dict[str, list[tuple[float, float]]]:
    """Per worker, ``(asked at, seconds late)`` of every lateness its loop probe logged."""
    found: dict[str, list[tuple[float, float]]] = {}
    for worker, path in logs.items():
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        found[worker] = [
            (float(m.group(3)), float(m.group(2)))
            for m in map(_LATE.match, text.splitlines())
            if m is not None
        ]
    return found


def stays(
    rows: Iterable[Handled],
    start: float,
    end: float,
    longer_than: float,
    written: Mapping[str, float],
    late: Mapping[str, list[tuple[float, float]]],
    puts: Iterable[tuple[float, float]] = (),
) -> list[Stay]:
    """Every pause over ``longer_than`` seconds of a shard that stayed with its worker, ending
    in ``[start, end]`` (``written``: record id -> send time; ``late``: per worker, the loop
    probe's ``(asked at, seconds)``; ``puts``: the producer's ``(sent at, seconds)`` calls)."""
    by_shard: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    for worker, shard, record_id, at in rows:
        by_shard[shard].append((at, worker, record_id))
    calls = list(puts)
    found: list[Stay] = []
    for shard, handled in by_shard.items():
        handled.sort()
        for (last, old, rid_a), (first, new, rid_b) in itertools.pairwise(handled):
            if old != new or first - last <= longer_than or not start <= first <= end:
                continue
            a, b = written.get(rid_a), written.get(rid_b)
            worst_late = max(
                (s for at, s in late.get(old, []) if at < first and at + s > last), default=0.0
            )
            worst_put = max((s for at, s in calls if at < first and at + s > last), default=0.0)
            found.append(
                Stay(
                    shard,
                    old,
                    last,
                    first,
                    None if a is None or b is None else round(b - a, 3),
                    round(worst_late, 3),
                    round(worst_put, 3),
                )
            )
    return found


def stay_summary(found: list[Stay], worst: int = 5) -> dict[str, Any]:
    """How many such pauses, how many the producer's own gap explains (beyond it by 0.25 s at
    most), how many fell while the worker's loop was late; the worst by their excess over
    the producer's gap."""
    excess = [s.beyond_writer for s in found if s.beyond_writer is not None]
    ranked = sorted(
        found,
        key=lambda s: s.beyond_writer if s.beyond_writer is not None else s.gap,
        reverse=True,
    )
    return {
        "pauses": len(found),
        "gap_max": round(max((s.gap for s in found), default=0.0), 3),
        "writer_explains": sum(1 for e in excess if e <= 0.25),
        "loop_late": sum(1 for s in found if s.loop_late > 0),
        "beyond_writer_max": round(max(excess), 3) if excess else None,
        "worst": [
            asdict(s) | {"gap": round(s.gap, 3), "beyond_writer": s.beyond_writer}
            for s in ranked[:worst]
        ],
    }


def describe_stays(summary: dict[str, Any], longer_than: float) -> list[str]:
    """Lines for the bench's output (see :func:`stay_summary`)."""
    if not summary["pauses"]:
        return [f"no shard that stayed paused over {longer_than:g} s"]
    lines = [
        f"{summary['pauses']} pauses over {longer_than:g} s of shards that stayed (longest "
        f"{fmt(summary['gap_max'])}): the producer's own gap within 0.25 s in "
        f"{summary['writer_explains']}, the worker's loop late in {summary['loop_late']}; "
        f"longest beyond the producer's gap {fmt(summary['beyond_writer_max'])}"
    ]
    for s in summary["worst"]:
        lines.append(
            f"  {s['shard'][-4:]} on {s['worker']}: gap {fmt(s['gap'])}, producer's gap "
            f"{fmt(s['writer_gap'])}, loop late {fmt(s['loop_late'])}, slowest PutRecords "
            f"{fmt(s['slow_put'])}"
        )
    return lines


# --- both together: what fleet.py and handoff.py report per planned move -----------------------


def stay_pause(rate: float) -> float:
    """The pause of a shard that stayed with its worker worth explaining at ``rate`` records/s
    per shard: longer than the producer's own gap by a quarter second (0.75 s at 2 records/s,
    0.45 s at 5)."""
    return round(1.0 / rate + 0.25, 3)


def explain(
    rows: Iterable[Handled],
    logs: Mapping[str, Path],
    start: float,
    end: float,
    written: Mapping[str, float],
    puts: Iterable[tuple[float, float]],
    longer_than: float,
) -> dict[str, Any]:
    """The pauses of a window, read from the workers' logs (``logs``: worker -> its log
    file) and what they handled: ``handoffs`` (:func:`stage_summary` of the shards that changed
    hands) and ``stays`` (:func:`stay_summary` of the pauses over ``longer_than`` s of the
    others, set against the producer's own gaps and calls, ``puts``, and each worker's loop
    lateness), each one summary of its kind."""
    rows = list(rows)
    found = moves(rows, read_events(logs), start, end, written)
    paused = stays(rows, start, end, longer_than, written, read_loop_late(logs), puts)
    return {
        "handoffs": stage_summary(found),
        "stays": stay_summary(paused) | {"longer_than": longer_than},
    }


def handoff_line(summary: dict[str, Any]) -> str:
    """The median move's stages and the slowest move's, in one line (for rendered tables)."""
    if not summary["moves"]:
        return "no shard changed hands"
    stages = ", ".join(
        f"{STAGE_TITLES[name]} {fmt_s(values['median'])} (max {fmt_s(values['max'])})"
        for name, values in summary["stages"].items()
    )
    line = (
        f"{summary['moves']} moves, median gap {fmt_s(summary['gap_median'])}, the new owner's "
        f"first record waited {fmt_s(summary.get('first_delay_median'))} (max "
        f"{fmt_s(summary.get('first_delay_max'))}); median stages: {stages}"
        f"{writes_text(summary, fmt_s)}"
    )
    if summary["worst"]:
        worst = summary["worst"][0]
        line += (
            f"; slowest, {worst['shard']} {worst['old']} -> {worst['new']}: gap "
            f"{fmt_s(worst['gap'])} = "
            + " + ".join(f"{name} {fmt_s(value)}" for name, value in worst["stages"].items())
        )
    return line


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
