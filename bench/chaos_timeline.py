"""The chaos soak's checks over time: what each fault did, and who owned which shard when.

Used by ``chaos_check.check``; each function reads the parsed logs (``Call``, ``Fault``,
``Acked``, ``LeaseEvent``) and returns plain data for the report:

- :func:`interruptions`: per fault, the handler calls it hit in flight (started, not finished
  when the fault began): the proof that kills, SIGSTOPs and brownouts landed inside calls;
- :func:`silent_faults`: proxy faults (brownouts, throttling) that failed no request at all;
- :func:`progress`: per fault, how long after it ended each shard with work to do handled a
  record again (p50 / max; shards that never did are stalled);
- :func:`catch_up`: how long after the last fault ended every record acknowledged before it
  was handled, and the latency of the records acknowledged after it;
- :func:`ownership`: lease ownership intervals per shard from the workers' lease events,
  and any moment two live workers owned one shard.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos_check import Acked, Call, Fault

PROXY_FAULTS = frozenset({"throttle", "kinesis_brownout", "dynamodb_brownout"})
"""Faults the fault proxy injects: each must have failed at least one request."""
MUST_INTERRUPT = frozenset({"kill", "stop", "dynamodb_brownout"})
"""Faults that must catch handler calls in flight, else the soak did not test what it says."""
# Acquisitions that wait for the previous owner to be gone: any overlap with a live previous
# owner is two owners at once. A handoff or a balancing steal tells the previous owner, which
# stops at its next renewal: a short overlap of beliefs, bounded by HANDOVER_BOUND.
_TAKEN_OVER = frozenset({"free", "expired", "resumed"})


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One ``L`` line of a worker log: ``event`` (LeaseAcquired, LeaseLost, LeaseReleased,
    Started, Exited, ...) about ``shard`` at ``at``; ``detail`` is how / why / the PID."""

    worker: str
    event: str
    shard: str
    at: float
    detail: str = ""
    lapse: str = ""
    """On a LeaseLost line of an expired lease: ``in_flight/failed`` as the worker saw them
    at the deadline (``-`` for none; see :class:`shardflow.events.Lapse`)."""

    def slow_table(self, unanswered: float) -> bool:
        """A lease that lapsed here because the lease table did not answer: a write of it was
        unanswered for ``unanswered`` seconds or more, or its last renewal failed."""
        if self.event != "LeaseLost" or self.detail != "expired" or "/" not in self.lapse:
            return False
        in_flight, _, failed = self.lapse.partition("/")
        try:
            slow = in_flight != "-" and float(in_flight) >= unanswered
        except ValueError:
            slow = False
        return slow or failed not in ("", "-")


def _lines(path: Path) -> list[str]:
    """Whole lines of a log (a worker killed mid-write leaves a torn last line: dropped)."""
    if not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").split("\n")[:-1] if line]


def read_lease_events(paths: Iterable[Path]) -> list[LeaseEvent]:
    events = []
    for path in paths:
        for line in _lines(path):
            f = line.split("\t")
            if f[0] == "L" and len(f) >= 5:
                try:
                    at = float(f[4])
                except ValueError:
                    continue
                detail, lapse = ([*f[5:7], "", ""])[:2]
                events.append(LeaseEvent(f[1], f[2], f[3], at, detail, lapse))
    events.sort(key=lambda e: e.at)
    return events


# --- faults and calls in flight -------------------------------------------------------------


def _in_flight(call: Call, at: float, died: float | None) -> bool:
    if call.end is None:  # cut by its worker's death: in flight from its start to the death
        return call.start <= at and (died is None or at <= died)
    return call.start <= at < call.end


def interruptions(calls: Sequence[Call], faults: Sequence[Fault]) -> list[dict[str, Any]]:
    """Per fault (in the fault log's order): the calls in flight when it began.

    A kill, a SIGSTOP or a SIGTERM counts the calls of its target worker; a fleet-wide fault
    (brownout, throttling, split, merge) the calls of every worker. A call a kill cut never
    ends (``end`` None): it was in flight from its start on.
    """
    deaths = {f.target: f.start for f in faults if f.kind == "kill"}
    by_worker: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        by_worker[c.worker].append(c)
    out = []
    for f in faults:
        pool = by_worker.get(f.target, []) if f.kind in ("kill", "stop", "term") else calls
        hit = sum(1 for c in pool if _in_flight(c, f.start, deaths.get(c.worker)))
        out.append(
            {
                "kind": f.kind,
                "target": f.target,
                "start": round(f.start, 3),
                "end": round(f.end, 3),
                "pid": f.pid,
                "requests_failed": f.injected,
                "interrupted": hit,
            }
        )
    return out


def silent_faults(faults: Sequence[Fault]) -> list[str]:
    """Proxy faults whose window failed no request: the fault did not happen."""
    return [
        f"{f.kind} at {f.start:.3f} failed 0 requests"
        for f in faults
        if f.kind in PROXY_FAULTS and not f.injected
    ]


def uninterrupting(per_fault: Sequence[dict[str, Any]]) -> list[str]:
    """Kills, SIGSTOPs and lease-table brownouts that caught no handler call in flight."""
    return [
        f"{p['kind']} {p['target']} at {p['start']:.3f} interrupted 0 calls"
        for p in per_fault
        if p["kind"] in MUST_INTERRUPT and p["interrupted"] == 0
    ]


# --- progress after each fault --------------------------------------------------------------


@dataclass
class Progress:
    """Per fault: seconds from its end (or the end of the faults overlapping it) until each
    shard with work handled a record; ``stalled``: shards that never did."""

    kind: str
    target: str
    reference: float
    delays: dict[str, float] = field(default_factory=dict)
    stalled: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        values = sorted(self.delays.values())
        return {
            "kind": self.kind,
            "target": self.target,
            "from": round(self.reference, 3),
            "shards": len(values) + len(self.stalled),
            "p50": round(statistics.median(values), 2) if values else None,
            "max": round(values[-1], 2) if values else None,
            "stalled": self.stalled,
        }


def _quiet_after(fault: Fault, faults: Sequence[Fault]) -> float:
    """The end of ``fault``, pushed to the end of any fault still running then (repeatedly):
    progress is owed from the moment no fault runs."""
    at = fault.end
    moved = True
    while moved:
        moved = False
        for f in faults:
            if f.start <= at < f.end:
                at, moved = f.end, True
    return at


def progress(
    acked: Sequence[Acked], calls: Sequence[Call], faults: Sequence[Fault]
) -> list[Progress]:
    """For each fault, per shard with work after it, the wait until the shard moved again.

    A shard has work from ``w``: the reference time if a record acknowledged earlier was not
    yet handled then, else the acknowledgement of its next record. It moved again at the
    first handler call on it that starts at or after ``w`` (any record, any outcome), or, if
    earlier, at the end of a call already running at the reference that finished one of the
    waiting records. A shard whose last records were in flight across the reference (a merge
    parent that then closed, say) has no later call and still progressed, unless records
    the running calls did not finish wait too.
    """
    first_ok: dict[tuple[str, str], tuple[float, float]] = {}  # record -> (end, its start)
    starts: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        starts[c.shard].append(c.start)
        if c.outcome == "ok" and c.end is not None:
            ident = (c.key, c.seq)
            if ident not in first_ok or c.end < first_ok[ident][0]:
                first_ok[ident] = (c.end, c.start)
    for times in starts.values():
        times.sort()
    never = (float("inf"), float("inf"))
    # shard -> (acknowledged, handled, start of the call that handled it)
    acks: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for a in acked:
        done, began = first_ok.get((a.key, str(a.seq)), never)
        acks[a.shard].append((a.at, done, began))
    out = []
    for f in faults:
        ref = _quiet_after(f, faults)
        result = Progress(f.kind, f.target, ref)
        for shard, records in acks.items():
            waiting = [(at, done, began) for at, done, began in records if done > ref]
            if not waiting:
                continue
            w = max(ref, min(at for at, _, _ in waiting))
            in_flight = [done for _, done, began in waiting if began < ref]
            times = starts.get(shard, [])
            i = bisect.bisect_left(times, w)
            if i < len(times):
                result.delays[shard] = min([times[i], *in_flight]) - w
            elif in_flight and len(in_flight) == len(waiting):
                # Every waiting record was finished by a call running across the reference.
                result.delays[shard] = min(in_flight) - w
            else:
                result.stalled.append(shard)
        result.stalled.sort()
        out.append(result)
    return out


def catch_up(
    acked: Sequence[Acked], calls: Sequence[Call], faults: Sequence[Fault]
) -> dict[str, Any]:
    """Seconds from the last fault's end until every record acknowledged before it was
    handled (None: some never were), and the handling latency (first successful end minus
    acknowledgement) of the records acknowledged after it: small when the fleet keeps up."""
    first_ok: dict[tuple[str, str], float] = {}
    for c in calls:
        if c.outcome == "ok" and c.end is not None:
            ident = (c.key, c.seq)
            first_ok[ident] = min(first_ok.get(ident, c.end), c.end)
    last = max((f.end for f in faults), default=None)
    if last is None:
        return {"last_fault_end": None, "caught_up_after": None, "latency_after_faults": None}
    before = [first_ok.get((a.key, str(a.seq))) for a in acked if a.at <= last]
    caught: float | None
    if any(t is None for t in before):
        caught = None
    else:
        caught = max(0.0, max((t for t in before if t is not None), default=last) - last)
    after = sorted(
        done - a.at
        for a in acked
        if a.at > last and (done := first_ok.get((a.key, str(a.seq)))) is not None
    )
    latency = None
    if after:
        latency = {
            "records": len(after),
            "p50": round(after[len(after) // 2], 3),
            "p99": round(after[min(len(after) - 1, int(len(after) * 0.99))], 3),
            "max": round(after[-1], 3),
        }
    return {
        "last_fault_end": round(last, 3),
        "caught_up_after": None if caught is None else round(caught, 2),
        "latency_after_faults": latency,
    }


# --- lease ownership ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Owned:
    """``worker`` owned ``shard`` (by its own events) from ``start`` to ``end``; ``how`` it
    got the lease."""

    worker: str
    shard: str
    start: float
    end: float
    how: str


@dataclass
class Ownership:
    intervals: int = 0
    double_owners: int = 0
    examples: list[str] = field(default_factory=list)
    handovers: int = 0
    handover_max: float = 0.0
    stale_after_stop: list[float] = field(default_factory=list)


HANDOVER_BOUND = 10.0
"""A previous owner told of a handoff or steal must let go within this many seconds (its next
renewal); a longer overlap counts as two owners."""


def ownership_intervals(
    events: Sequence[LeaseEvent], faults: Sequence[Fault], end_of_run: float
) -> tuple[list[Owned], list[float]]:
    """Each worker's lease holdings as its events tell them, cut where it stopped being live:
    its kill, its SIGSTOP (frozen, it runs nothing until SIGCONT), its exit. A frozen worker
    that still believed in a lease after SIGCONT until its LeaseLost: returned as the stale
    seconds (not ownership: the lease had expired under it)."""
    gone: dict[str, float] = {}
    for f in faults:
        if f.kind == "kill":
            gone[f.target] = min(gone.get(f.target, f.start), f.start)
    stops: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for f in faults:
        if f.kind == "stop":
            stops[f.target].append((f.start, f.end))
    for e in events:
        if e.event == "Exited":
            gone[e.worker] = min(gone.get(e.worker, e.at), e.at)
    open_: dict[tuple[str, str], tuple[float, str]] = {}
    out: list[Owned] = []
    stale: list[float] = []

    def close(worker: str, shard: str, at: float) -> None:
        began, how = open_.pop((worker, shard))
        end = min(at, gone.get(worker, at))
        for s_start, s_end in stops.get(worker, []):
            if began < s_start < end:
                if end > s_end:
                    stale.append(end - s_end)
                end = s_start
                break
        out.append(Owned(worker, shard, began, max(began, end), how))

    for e in events:
        if e.event == "LeaseAcquired":
            if (e.worker, e.shard) in open_:
                close(e.worker, e.shard, e.at)
            open_[(e.worker, e.shard)] = (e.at, e.detail)
        elif e.event in ("LeaseLost", "LeaseReleased") and (e.worker, e.shard) in open_:
            close(e.worker, e.shard, e.at)
    for worker, shard in list(open_):
        close(worker, shard, end_of_run)
    return out, stale


def ownership(
    events: Sequence[LeaseEvent], faults: Sequence[Fault], end_of_run: float, examples: int = 5
) -> Ownership:
    """Two live owners of one shard at once, from the ownership intervals.

    A lease taken as free, expired or resumed must begin after every other holder's ended;
    one taken by handoff or steal may overlap the previous holder's belief by at most
    :data:`HANDOVER_BOUND` (the previous holder learns at its next renewal)."""
    intervals, stale = ownership_intervals(events, faults, end_of_run)
    report = Ownership(intervals=len(intervals), stale_after_stop=[round(s, 2) for s in stale])
    by_shard: dict[str, list[Owned]] = defaultdict(list)
    for o in intervals:
        by_shard[o.shard].append(o)
    for shard, held in by_shard.items():
        held.sort(key=lambda o: o.start)
        for i, later in enumerate(held):
            for earlier in held[:i]:
                if earlier.worker == later.worker or earlier.end <= later.start:
                    continue
                overlap = min(earlier.end, later.end) - later.start
                if later.how not in _TAKEN_OVER and overlap <= HANDOVER_BOUND:
                    report.handovers += 1
                    report.handover_max = max(report.handover_max, round(overlap, 3))
                    continue
                report.double_owners += 1
                if len(report.examples) < examples:
                    report.examples.append(
                        f"{shard}: {earlier.worker} [{earlier.start:.3f}, {earlier.end:.3f}] "
                        f"and {later.worker} ({later.how}) [{later.start:.3f}, {later.end:.3f}]"
                    )
    return report


def lease_taken_at(events: Sequence[LeaseEvent], shard: str, worker: str, after: float) -> float:
    """When another worker than ``worker`` first acquired ``shard`` after ``after`` (inf: never)."""
    for e in events:
        if e.event == "LeaseAcquired" and e.shard == shard and e.worker != worker and e.at > after:
            return e.at
    return float("inf")
