"""Dead letters in a local JSON-lines file: one letter per line, appended and fsynced per write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from shardflow.deadletter.model import DeadLetter
from shardflow.errors import DeadLetterWriteError, MalformedDeadLetterError

MalformedCallback = Callable[[MalformedDeadLetterError], None]
"""Told about each letter that cannot be read (it is skipped)."""


class JsonLinesDestination:
    """Appends dead letters to ``path`` (created with its directory if missing).

    Each ``write`` appends its letters, flushes and fsyncs before returning, so a returned write
    survives a crash of the process or the machine. A write that fails is cut back off the file
    (best effort), so readers do not meet half a line. Writes are serialized; the file work runs
    in a thread so the event loop keeps going during fsync.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: BinaryIO | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"JsonLinesDestination({str(self.path)!r})"

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        payload = b"".join(letter.to_bytes() + b"\n" for letter in letters)
        async with self._lock:
            if self._closed:
                raise DeadLetterWriteError(str(self.path), len(letters), "destination is closed")
            try:
                await asyncio.to_thread(self._append, payload)
            except OSError as exc:
                raise DeadLetterWriteError(
                    str(self.path), len(letters), f"{type(exc).__name__}: {exc}"
                ) from exc

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            if self._file is not None:
                file, self._file = self._file, None
                await asyncio.to_thread(file.close)

    def _open(self) -> BinaryIO:
        if self._file is None:
            created = not self.path.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Owner only: letters hold records' data. Kept open across writes.
            self._file = os.fdopen(
                os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
            )
            if created:
                # The new file's directory entry must survive a crash as well as its content.
                _fsync_directory(self.path.parent)
        return self._file

    def _append(self, payload: bytes) -> None:
        file = self._open()
        start = file.seek(0, os.SEEK_END)
        try:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        except OSError:
            self._cut_back(file, start)
            raise

    def _cut_back(self, file: BinaryIO, size: int) -> None:
        try:
            file.truncate(size)
        except OSError:
            # The failure is reported anyway; a torn last line is refused by the reader.
            self._file = None
            file.close()


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. Windows): the file itself is still fsynced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json_lines(
    path: str | os.PathLike[str], *, on_malformed: MalformedCallback | None = None
) -> Iterator[DeadLetter]:
    """The letters of a JSON-lines file, in file order; blank lines are skipped.

    A bad letter raises :class:`~shardflow.errors.MalformedDeadLetterError` naming the file and
    line, or, with ``on_malformed``, is handed to it and skipped.
    """
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                letter = parse_letter(line, f"{path}:{number}", on_malformed)
                if letter is not None:
                    yield letter


def parse_letter(
    text: str | bytes, where: str, on_malformed: MalformedCallback | None
) -> DeadLetter | None:
    """One stored letter; a bad one raises, or with ``on_malformed`` is handed to it (None)."""
    try:
        return DeadLetter.from_json(text, where=where)
    except MalformedDeadLetterError as exc:
        if on_malformed is None:
            raise
        on_malformed(exc)
        return None
