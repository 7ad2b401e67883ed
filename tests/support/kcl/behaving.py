"""A kclpy record processor (v2 or v3 interface) that behaves as a test asks: checkpoints
mid-batch, raises, exits or hangs on a given record, asks for checkpoints the KCL refuses.

Run by a MultiLangDaemon (shardflow's or the KCL's) with the kclpy scratch venv's Python, so it
imports only the standard library, ``amazon_kclpy`` and its neighbour ``handled.py``. It logs
every record handled and every life-cycle event (``E`` lines: initialize, checkpoint with the
position or the error name, shutdown with its reason, ...) to ``--out``. ``--raise-on``,
``--exit-on`` and ``--hang-on`` name a record key; each misbehaviour happens once per key (a
marker file next to ``--out`` remembers it across restarts).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from amazon_kclpy import kcl
from amazon_kclpy.v2 import processor as v2
from amazon_kclpy.v3 import processor as v3
from handled import event_line, record_line  # this script's own folder is on sys.path


class Behaviour:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.shard = "?"
        self.last: tuple[str, int] | None = None
        self.unsaved = 0

    def event(self, name: str, detail: str = "") -> None:
        os.write(
            self.out, event_line(self.args.worker, self.shard, name, detail, time.time()).encode()
        )

    def once(self, what: str, key: str) -> bool:
        """True the first time ``what`` happens for ``key`` (across restarts)."""
        marker = Path(f"{self.args.out}.{what}.{key}")
        if marker.exists():
            return False
        marker.touch()
        return True

    def checkpoint(self, checkpointer, sequence=None, sub=None) -> None:  # type: ignore[no-untyped-def]
        try:
            checkpointer.checkpoint(sequence, sub)
        except kcl.CheckpointError as error:
            self.event("checkpoint-error", f"{error.value} at {sequence}/{sub}")
            return
        self.unsaved = 0
        self.event("checkpoint", f"{sequence}/{sub}" if sequence is not None else "end")

    def records(self, records, checkpointer) -> None:  # type: ignore[no-untyped-def]
        args = self.args
        lines = []
        now = time.time()
        for index, record in enumerate(records):
            key = record.binary_data.split(b"|", 1)[0][:64].decode(errors="replace")
            if key == args.exit_on and self.once("exit", key):
                os.write(self.out, "".join(lines).encode())
                sys.stderr.write(f"exiting on record {key}\n")
                sys.stderr.flush()
                os._exit(3)
            if key == args.hang_on and self.once("hang", key):
                os.write(self.out, "".join(lines).encode())
                self.event("hang", key)
                time.sleep(3600)
            if key == args.raise_on and self.once("raise", key):
                os.write(self.out, "".join(lines).encode())
                raise RuntimeError(f"cannot handle record {key}")
            lines.append(
                record_line(
                    args.worker,
                    self.shard,
                    record.sequence_number,
                    record.sub_sequence_number,
                    key,
                    now,
                )
            )
            if args.midbatch and index == len(records) // 2:
                os.write(self.out, "".join(lines).encode())
                lines = []
                self.checkpoint(checkpointer, record.sequence_number, record.sub_sequence_number)
        os.write(self.out, "".join(lines).encode())
        if records:
            self.last = (records[-1].sequence_number, records[-1].sub_sequence_number)
            self.unsaved += len(records)
        if args.refused_checkpoint and records:
            self.checkpoint(checkpointer, "1" + records[-1].sequence_number, 0)  # beyond: refused
        if args.checkpoint_batches and records:
            self.checkpoint(checkpointer)

    def shutdown_requested(self, checkpointer) -> None:  # type: ignore[no-untyped-def]
        self.event("shutdown-requested")
        if self.unsaved:
            self.checkpoint(checkpointer)


class V3(v3.RecordProcessorBase):  # type: ignore[misc]
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def initialize(self, initialize_input) -> None:  # type: ignore[no-untyped-def]
        self.b.shard = initialize_input.shard_id
        seq = initialize_input.sequence_number
        self.b.event("initialize", f"{seq}/{initialize_input.sub_sequence_number}")

    def process_records(self, process_records_input) -> None:  # type: ignore[no-untyped-def]
        self.b.records(process_records_input.records, process_records_input.checkpointer)

    def lease_lost(self, lease_lost_input) -> None:  # type: ignore[no-untyped-def]
        self.b.event("lease-lost")

    def shard_ended(self, shard_ended_input) -> None:  # type: ignore[no-untyped-def]
        self.b.event("shard-ended")
        self.b.checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input) -> None:  # type: ignore[no-untyped-def]
        self.b.shutdown_requested(shutdown_requested_input.checkpointer)


class V2(v2.RecordProcessorBase):  # type: ignore[misc]
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour

    def initialize(self, initialize_input) -> None:  # type: ignore[no-untyped-def]
        self.b.shard = initialize_input.shard_id
        seq = initialize_input.sequence_number
        self.b.event("initialize", f"{seq}/{initialize_input.sub_sequence_number}")

    def process_records(self, process_records_input) -> None:  # type: ignore[no-untyped-def]
        self.b.records(process_records_input.records, process_records_input.checkpointer)

    def shutdown(self, shutdown_input) -> None:  # type: ignore[no-untyped-def]
        self.b.event("shutdown", shutdown_input.reason)
        if shutdown_input.reason == "TERMINATE":
            self.b.checkpoint(shutdown_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input) -> None:  # type: ignore[no-untyped-def]
        self.b.shutdown_requested(shutdown_requested_input.checkpointer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--interface", choices=("v2", "v3"), default="v3")
    parser.add_argument("--midbatch", action="store_true")
    parser.add_argument("--checkpoint-batches", action="store_true")
    parser.add_argument("--refused-checkpoint", action="store_true")
    parser.add_argument("--raise-on")
    parser.add_argument("--exit-on")
    parser.add_argument("--hang-on")
    args = parser.parse_args()
    behaviour = Behaviour(args)
    kcl.KCLProcess(V2(behaviour) if args.interface == "v2" else V3(behaviour)).run()


if __name__ == "__main__":
    main()
