"""The handled-records log shared by KCL processors and shardflow workers, and its reading.

One line per handled record, appended with a single ``write`` (processes share the file):

    R <tab> worker <tab> shard <tab> sequence <tab> sub-sequence <tab> key <tab> unix time

``key`` is the record data up to the first ``|``. Life-cycle events of KCL processors:
``E <tab> worker <tab> shard <tab> event <tab> detail <tab> unix time``. Standard library only:
the KCL processor (run by the scratch venv's Python) imports this module too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path


def record_line(worker: str, shard: str, sequence: str, sub: int, key: str, at: float) -> str:
    return f"R\t{worker}\t{shard}\t{sequence}\t{sub}\t{key}\t{at:.6f}\n"


def event_line(worker: str, shard: str, event: str, detail: str, at: float) -> str:
    return f"E\t{worker}\t{shard}\t{event}\t{detail}\t{at:.6f}\n"


@dataclass(frozen=True)
class Handled:
    worker: str
    shard: str
    sequence: str
    sub: int
    key: str
    at: float

    @property
    def position(self) -> tuple[str, str, int]:
        return (self.shard, self.sequence, self.sub)


@dataclass(frozen=True)
class Event:
    worker: str
    shard: str
    event: str
    detail: str
    at: float


def read_handled(paths: Iterable[Path]) -> list[Handled]:
    """Every record line of the files that exist, in time order (a torn last line is skipped)."""
    found: list[Handled] = []
    for path in paths:
        for fields in _lines(path, "R"):
            found.append(
                Handled(
                    fields[0], fields[1], fields[2], int(fields[3]), fields[4], float(fields[5])
                )
            )
    found.sort(key=lambda handled: handled.at)
    return found


def read_events(paths: Iterable[Path]) -> list[Event]:
    found = [Event(*fields[:4], float(fields[4])) for path in paths for fields in _lines(path, "E")]
    found.sort(key=lambda event: event.at)
    return found


_FIELDS = {"R": 7, "E": 6}
"""Fields of a whole line of each kind (a torn last line has fewer)."""


def _lines(path: Path, kind: str) -> Iterable[list[str]]:
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        fields = line.split("\t")
        if fields[0] == kind and len(fields) == _FIELDS[kind]:
            yield fields[1:]


def duplicates(handled: Iterable[Handled]) -> int:
    """How many handlings were of a record (shard, sequence, sub-sequence) handled before."""
    counts = Counter(record.position for record in handled)
    return sum(count - 1 for count in counts.values())


def duplicated(handled: Iterable[Handled]) -> list[Handled]:
    """The second and later handlings of each record, in time order."""
    seen: set[tuple[str, str, int]] = set()
    again = []
    for record in handled:
        if record.position in seen:
            again.append(record)
        seen.add(record.position)
    return again


def longest_gaps(handled: Iterable[Handled], start: float, end: float) -> dict[str, float]:
    """Per shard, the longest time in [start, end] with no record of that shard handled."""
    times: dict[str, list[float]] = defaultdict(list)
    for record in handled:
        times[record.shard].append(record.at)
    gaps: dict[str, float] = {}
    for shard, moments in times.items():
        inside = sorted(t for t in moments if start <= t <= end)
        edges = [start, *inside, end]
        gaps[shard] = max(b - a for a, b in pairwise(edges))
    return gaps
