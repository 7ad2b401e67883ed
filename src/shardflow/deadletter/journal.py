"""What a replay has already put back, so that running it again adds no duplicates.

A journal is a local file with one line per letter replayed: the target stream and the letter's
origin (stream/shard/sequence.sub), tab-separated. A line is appended once the record's
PutRecords answer arrived, so a replay stopped at any point (Ctrl-C, a crash, a failure) can be
run again: letters already in the journal for that target are skipped, the rest are replayed.
Records whose answer had not arrived when the replay stopped may be put twice (at-least-once).
The file is created readable by its owner only: origins name streams and shards.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Self

from shardflow.deadletter.model import DeadLetter


class ReplayJournal:
    """The journal at ``path`` (created on first use, mode 0600)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._done: set[tuple[str, str]] = set()
        self._fd: int | None = None

    def open(self) -> Self:
        """Read what earlier runs replayed (the file is created at the first record)."""
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                target, sep, origin = line.partition("\t")
                if sep:  # a torn last line (a crash mid-write) names nothing
                    self._done.add((target, origin))
        return self

    def replayed(self, target: str, letter: DeadLetter) -> bool:
        """Whether ``letter``'s record was already put on ``target`` (by any run)."""
        return (target, letter.origin) in self._done

    def record(self, target: str, letter: DeadLetter) -> None:
        """Note that ``letter``'s record is on ``target`` now."""
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._done.add((target, letter.origin))
        os.write(self._fd, f"{target}\t{letter.origin}\n".encode())

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.fsync(fd)
            os.close(fd)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
