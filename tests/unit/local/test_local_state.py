"""The state file of a detached stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardflow.errors import LocalStackError
from shardflow.local.state import (
    ServerRecord,
    default_state_dir,
    read_state,
    state_file,
    write_state,
)

RECORD = ServerRecord(
    name="moto",
    pid=4242,
    port=5000,
    endpoint_url="http://127.0.0.1:5000",
    log_path="/tmp/logs/moto.log",
    command=("/usr/bin/python3", "-m", "moto.server", "-H", "127.0.0.1", "-p", "5000"),
    stop_timeout=5.0,
)


def test_records_round_trip(tmp_path: Path) -> None:
    path = state_file(tmp_path / "nested" / "dir")
    other = ServerRecord(**{**RECORD.__dict__, "name": "kinesalite", "pid": 4343})
    write_state(path, [RECORD, other])
    assert read_state(path) == [RECORD, other]
    assert [p.name for p in path.parent.iterdir()] == ["local.json"]  # no temporary file left


def test_no_state_file_means_none(tmp_path: Path) -> None:
    assert read_state(tmp_path / "local.json") is None


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"version": 99, "servers": []}),
        json.dumps({"version": 1, "servers": [{"name": "moto"}]}),
        json.dumps({"version": 1, "servers": [{**RECORD.__dict__, "pid": "not a number"}]}),
        json.dumps([1, 2]),
    ],
    ids=["not json", "unknown version", "missing fields", "bad pid", "not an object"],
)
def test_unreadable_state_is_a_typed_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "local.json"
    path.write_text(content)
    with pytest.raises(LocalStackError, match="local stack state"):
        read_state(path)


def test_state_is_per_user_not_per_directory(tmp_path: Path) -> None:
    assert default_state_dir({"SHARDFLOW_STATE_DIR": str(tmp_path)}) == tmp_path
    assert default_state_dir({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/shardflow")
    assert default_state_dir({}) == Path.home() / ".local" / "state" / "shardflow"
