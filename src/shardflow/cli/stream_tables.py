"""Rich tables of streams and shards for ``shardflow stream``."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from shardflow.shards import MAX_HASH_KEY, ShardInfo


def _stdout() -> Console:
    # Piped output is not cut to 80 columns: 39-digit hash keys must survive `| grep`.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 400)


def print_stream_list(streams: Sequence[Mapping[str, Any]]) -> None:
    if not streams:
        _stdout().print("no streams")
        return
    if not any("StreamStatus" in s for s in streams):
        # Some services list names only (kinesalite, kinesis-local).
        table = Table("stream", box=None, pad_edge=False)
        for stream in streams:
            table.add_row(stream["StreamName"])
    else:
        table = Table("stream", "status", "mode", "created", box=None, pad_edge=False)
        for stream in streams:
            table.add_row(
                stream["StreamName"],
                stream.get("StreamStatus", "-"),
                _mode(stream),
                _when(stream.get("StreamCreationTimestamp")),
            )
    _stdout().print(table)


def print_stream(summary: Mapping[str, Any], shards: list[ShardInfo]) -> None:
    console = _stdout()
    about = Table(show_header=False, box=None, pad_edge=False)
    about.add_column(style="bold")
    about.add_column()
    about.add_row("stream", str(summary.get("StreamName", "")))
    about.add_row("arn", str(summary.get("StreamARN", "")))
    about.add_row("status", str(summary.get("StreamStatus", "")))
    about.add_row("mode", _mode(summary))
    about.add_row("retention", f"{summary.get('RetentionPeriodHours', '?')} hours")
    about.add_row("open shards", str(sum(1 for s in shards if s.is_open)))
    about.add_row("all shards", str(len(shards)))
    about.add_row("encryption", str(summary.get("EncryptionType", "NONE")))
    about.add_row("created", _when(summary.get("StreamCreationTimestamp")))
    console.print(about)
    console.print()
    console.print(_shard_table(shards, closed_too=True))


def print_open_shards(stream: str, shards: list[ShardInfo]) -> None:
    console = _stdout()
    console.print(f"stream {stream}: {sum(1 for s in shards if s.is_open)} open shards")
    console.print(_shard_table([s for s in shards if s.is_open], closed_too=False))


def _shard_table(shards: list[ShardInfo], *, closed_too: bool) -> Table:
    table = Table(box=None, pad_edge=False)
    table.add_column("shard", no_wrap=True)
    if closed_too:
        table.add_column("state", no_wrap=True)
    table.add_column("parents", no_wrap=True)
    table.add_column("starting hash key", justify="right", no_wrap=True)
    table.add_column("ending hash key", justify="right", no_wrap=True)
    table.add_column("key space", justify="right", no_wrap=True)
    for shard in shards:
        share = (shard.hash_range.end - shard.hash_range.start + 1) / (MAX_HASH_KEY + 1)
        cells = [shard.shard_id]
        if closed_too:
            cells.append("open" if shard.is_open else "closed")
        cells += [
            ", ".join(shard.parent_ids) or "-",
            str(shard.hash_range.start),
            str(shard.hash_range.end),
            f"{share:.1%}",
        ]
        table.add_row(*cells)
    return table


def _mode(summary: Mapping[str, Any]) -> str:
    details = summary.get("StreamModeDetails") or {}
    return str(details.get("StreamMode", "PROVISIONED"))


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else ""
