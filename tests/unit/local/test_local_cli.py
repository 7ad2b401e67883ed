"""``shardflow local`` commands against stand-in processes (no emulator needed)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardflow.cli import app
from shardflow.local.ports import free_port
from shardflow.local.process import is_alive
from shardflow.local.readiness import answers_http
from shardflow.local.state import ServerRecord, read_state, state_file, write_state

runner = CliRunner()
HTTP_SERVER = "import http.server as h, sys; h.test(h.SimpleHTTPRequestHandler, port=int(sys.argv[1]), bind='127.0.0.1')"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def start(
    processes: list[subprocess.Popen[bytes]], *, answers: bool
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    code = HTTP_SERVER if answers else "import time; time.sleep(60)"
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    processes.append(process)
    deadline = time.monotonic() + 10
    while answers and not answers_http(port):
        assert time.monotonic() < deadline, "stand-in server did not start"
        time.sleep(0.02)
    return process, port


def record(
    name: str, process: subprocess.Popen[bytes], port: int, **changes: object
) -> ServerRecord:
    fields: dict[str, object] = {
        "name": name,
        "pid": process.pid,
        "port": port,
        "endpoint_url": f"http://127.0.0.1:{port}",
        "log_path": "/dev/null",
        "command": tuple(str(arg) for arg in process.args),  # type: ignore[union-attr]
        "stop_timeout": 1.0,
    }
    fields.update(changes)
    return ServerRecord(**fields)  # type: ignore[arg-type]


def local(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["local", *args])
    return result.exit_code, result.output


def test_status_and_down_without_a_stack(tmp_path: Path) -> None:
    code, output = local("status", "--state-dir", str(tmp_path))
    assert code == 1
    assert "No local stack recorded" in output
    code, output = local("down", "--state-dir", str(tmp_path))
    assert code == 0
    assert "No local stack recorded" in output


def test_status_probes_each_recorded_server(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    serving, serving_port = start(processes, answers=True)
    silent, silent_port = start(processes, answers=False)
    write_state(
        state_file(tmp_path),
        [record("moto", serving, serving_port), record("kinesalite", silent, silent_port)],
    )
    code, output = local("status", "--state-dir", str(tmp_path))
    assert code == 1  # one of the two does not answer
    assert "ready" in output
    assert "not answering" in output
    assert f"export AWS_ENDPOINT_URL=http://127.0.0.1:{serving_port}" in output

    silent.kill()
    silent.wait()
    write_state(state_file(tmp_path), [record("moto", serving, serving_port)])
    code, output = local("status", "--state-dir", str(tmp_path))
    assert code == 0, output


def test_down_stops_recorded_servers_but_not_a_reused_pid(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    ours, ours_port = start(processes, answers=True)
    stranger, stranger_port = start(processes, answers=True)
    reused = record("kinesis-local", stranger, stranger_port, command=("node", "main.js"))
    write_state(state_file(tmp_path), [record("moto", ours, ours_port), reused])
    code, output = local("down", "--state-dir", str(tmp_path))
    assert code == 0, output
    assert f"moto (pid {ours.pid}): stopped" in output
    assert "pid reused by another program, left alone" in output
    assert ours.wait(timeout=5) is not None
    assert is_alive(stranger.pid)
    assert read_state(state_file(tmp_path)) is None


def test_up_again_prints_the_running_stack_s_environment(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    serving, port = start(processes, answers=True)
    write_state(state_file(tmp_path), [record("moto", serving, port)])
    code, output = local("up", "--quiet", "--state-dir", str(tmp_path))
    assert code == 0, output
    assert f"export AWS_ENDPOINT_URL=http://127.0.0.1:{port}" in output.splitlines()
    assert is_alive(serving.pid)


def test_up_refuses_when_the_running_stack_lacks_a_wanted_server(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    serving, port = start(processes, answers=True)
    write_state(state_file(tmp_path), [record("moto", serving, port)])
    code, output = local("up", "--kinesis-local", "--state-dir", str(tmp_path))
    assert code == 1
    assert "already running" in output
    assert "without kinesis-local" in output
    assert "shardflow local down" in output
    assert is_alive(serving.pid)


def test_up_needs_a_server_and_reports_a_broken_state_file(tmp_path: Path) -> None:
    code, output = local("up", "--no-moto", "--state-dir", str(tmp_path))
    assert code == 1
    assert "at least one server" in output
    state_file(tmp_path).write_text("{broken")
    code, output = local("status", "--state-dir", str(tmp_path))
    assert code == 1
    assert "cannot read local stack state" in output
