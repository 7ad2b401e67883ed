"""The state file of a detached local stack (``shardflow local up``): which PIDs to stop later.

One stack per user, not per working directory: ``shardflow local down`` or ``status`` run from
any directory find the stack ``up`` started. The state lives in ``$SHARDFLOW_STATE_DIR`` when
set, else ``$XDG_STATE_HOME/shardflow``, else ``~/.local/state/shardflow``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shardflow.errors import LocalStackError
from shardflow.local.server import LocalServer
from shardflow.local.user_dirs import default_state_dir

__all__ = [
    "ServerRecord",
    "default_state_dir",
    "read_state",
    "state_file",
    "write_state",
]

STATE_FILE_NAME = "local.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ServerRecord:
    """What is known about one detached server: enough to probe it and to stop exactly it."""

    name: str
    pid: int
    port: int
    endpoint_url: str
    log_path: str
    #: The argument vector it was started with; a PID running anything else is not ours.
    command: tuple[str, ...]
    stop_timeout: float

    @classmethod
    def of(cls, server: LocalServer) -> ServerRecord:
        """The record of a started server."""
        return cls(
            name=server.name,
            pid=server.pid,
            port=server.port,
            endpoint_url=server.endpoint_url,
            log_path=str(server.log_path),
            command=tuple(server.command),
            stop_timeout=server.stop_timeout,
        )


def state_file(state_dir: Path) -> Path:
    """Where the state of the stack run from ``state_dir`` is kept."""
    return state_dir / STATE_FILE_NAME


def write_state(path: Path, records: list[ServerRecord]) -> None:
    """Write ``records`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"version": _FORMAT_VERSION, "servers": [asdict(r) for r in records]}
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(document, indent=2) + "\n")
    os.replace(partial, path)


def read_state(path: Path) -> list[ServerRecord] | None:
    """The records in ``path``, or None when there is no state file."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise LocalStackError(f"cannot read local stack state {path}: {error}") from error
    try:
        if document["version"] != _FORMAT_VERSION:
            raise ValueError(f"unknown version {document['version']!r}")
        return [_record(entry) for entry in document["servers"]]
    except (KeyError, TypeError, ValueError) as error:
        raise LocalStackError(f"malformed local stack state {path}: {error!r}") from error


def _record(entry: dict[str, Any]) -> ServerRecord:
    return ServerRecord(
        name=str(entry["name"]),
        pid=int(entry["pid"]),
        port=int(entry["port"]),
        endpoint_url=str(entry["endpoint_url"]),
        log_path=str(entry["log_path"]),
        command=tuple(str(arg) for arg in entry["command"]),
        stop_timeout=float(entry["stop_timeout"]),
    )
