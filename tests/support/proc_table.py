"""The machine's processes as /proc shows them: parent and CPU seconds of each (Linux)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    parent: int
    cpu: float
    """User + system seconds of the process itself (not of children it reaped)."""


def processes() -> list[Proc]:
    """Every process readable now (one that exits meanwhile is left out)."""
    found: list[Proc] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name in brackets may hold spaces and ')': split after the last one.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
        found.append(Proc(int(entry.name), int(fields[1]), cpu))
    return found
