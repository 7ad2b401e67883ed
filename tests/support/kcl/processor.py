"""A kclpy record processor that writes every record it handles to a file, for counting.

Run by the KCL MultiLangDaemon (one process per shard) with the scratch venv's Python, so it
imports only the standard library, ``amazon_kclpy`` and its neighbour ``handled.py`` (the line
format). ``key`` is the record data up to the first ``|`` (at most 64 characters): the benches
and tests write ``<id>|...`` records.

It checkpoints after ``--checkpoint-every`` records or ``--checkpoint-seconds`` seconds,
whichever comes first, at the last record handled; when asked to shut down (the KCL's graceful
shutdown and 3.x graceful lease handoff) and at shard end.
"""

from __future__ import annotations

import argparse
import os
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor
from handled import event_line, record_line  # this script's own folder is on sys.path

_RETRYABLE = ("ThrottlingException", "KinesisClientLibDependencyException")


class RecordingProcessor(processor.RecordProcessorBase):  # type: ignore[misc]
    def __init__(self, out: int, worker: str, every: int, seconds: float) -> None:
        self._out = out
        self._worker = worker
        self._every = every
        self._seconds = seconds
        self._shard = "?"
        self._unsaved = 0
        self._saved_at = time.monotonic()
        self._last: tuple[str, int] | None = None

    def _write(self, text: str) -> None:
        os.write(self._out, text.encode())

    def _event(self, event: str, detail: str = "") -> None:
        self._write(event_line(self._worker, self._shard, event, detail, time.time()))

    def initialize(self, initialize_input) -> None:  # type: ignore[no-untyped-def]
        self._shard = initialize_input.shard_id
        self._event("initialize", str(initialize_input.sequence_number))

    def process_records(self, process_records_input) -> None:  # type: ignore[no-untyped-def]
        records = process_records_input.records
        if records:
            now = time.time()
            lines = []
            for record in records:
                key = record.binary_data.split(b"|", 1)[0][:64].decode(errors="replace")
                lines.append(
                    record_line(
                        self._worker,
                        self._shard,
                        record.sequence_number,
                        record.sub_sequence_number,
                        key,
                        now,
                    )
                )
            self._write("".join(lines))
            last = records[-1]
            self._last = (last.sequence_number, last.sub_sequence_number)
            self._unsaved += len(records)
        due = time.monotonic() - self._saved_at >= self._seconds
        if self._last is not None and (self._unsaved >= self._every or (due and self._unsaved)):
            self._checkpoint(process_records_input.checkpointer, *self._last)

    def _checkpoint(self, checkpointer, sequence=None, sub=None) -> bool:  # type: ignore[no-untyped-def]
        for attempt in range(5):
            try:
                checkpointer.checkpoint(sequence, sub)
            except kcl.CheckpointError as error:
                if error.value in _RETRYABLE and attempt < 4:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                self._event("checkpoint-failed", f"{error.value} at {sequence}")
                return False
            self._unsaved = 0
            self._saved_at = time.monotonic()
            self._event("checkpoint", str(sequence if sequence is not None else "SHARD_END"))
            return True
        return False

    def lease_lost(self, lease_lost_input) -> None:  # type: ignore[no-untyped-def]
        self._event("lease-lost")

    def shard_ended(self, shard_ended_input) -> None:  # type: ignore[no-untyped-def]
        self._event("shard-ended")
        self._checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input) -> None:  # type: ignore[no-untyped-def]
        self._event("shutdown-requested")
        if self._last is not None and self._unsaved:
            self._checkpoint(shutdown_requested_input.checkpointer, *self._last)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--checkpoint-seconds", type=float, default=5.0)
    args = parser.parse_args()
    out = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    recorder = RecordingProcessor(out, args.worker, args.checkpoint_every, args.checkpoint_seconds)
    kcl.KCLProcess(recorder).run()


if __name__ == "__main__":
    main()
