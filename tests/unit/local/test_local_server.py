"""The server life cycle with stand-in servers (Python one-liners), no emulator needed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from shardflow.errors import LocalStackError, ServerExitedError, ServerNotReadyError
from shardflow.local import LocalServer
from shardflow.local import server as server_module
from shardflow.local.ports import accepts_connections
from shardflow.local.process import is_alive
from shardflow.local.readiness import answers_http

HTTP_SERVER = "import http.server as h, sys; h.test(h.SimpleHTTPRequestHandler, port=int(sys.argv[1]), bind='127.0.0.1')"


class HttpServer(LocalServer):
    """Answers HTTP on its port, like an emulator."""

    name: ClassVar[str] = "fake-http"

    def _build_command(self, port: int) -> list[str]:
        return [sys.executable, "-c", HTTP_SERVER, str(port)]


class CrashingServer(LocalServer):
    name: ClassVar[str] = "fake-crash"

    def _build_command(self, port: int) -> list[str]:
        return [sys.executable, "-c", "print('config is broken', flush=True); raise SystemExit(3)"]


class SilentServer(LocalServer):
    """Runs but never listens."""

    name: ClassVar[str] = "fake-silent"

    def _build_command(self, port: int) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


class UnluckyServer(HttpServer):
    """Its first launch finds the port taken, as when another process wins the race."""

    name: ClassVar[str] = "fake-unlucky"
    launches = 0

    def _build_command(self, port: int) -> list[str]:
        self.launches += 1
        if self.launches == 1:
            return [sys.executable, "-c", "print('listen EADDRINUSE'); raise SystemExit(1)"]
        return super()._build_command(port)


class EnvReportingServer(HttpServer):
    name: ClassVar[str] = "fake-env"

    def _build_env(self, port: int) -> dict[str, str]:
        return {"FAKE_SETTING": "on"}

    def _build_command(self, port: int) -> list[str]:
        show_env = "import os; print(sorted(os.environ.items()), flush=True); "
        return [sys.executable, "-c", show_env + HTTP_SERVER, str(port)]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process the servers spawn (killed at the end should a test leave one behind)."""
    processes: list[subprocess.Popen[bytes]] = []
    real_spawn: Callable[..., subprocess.Popen[bytes]] = server_module.spawn

    def recording_spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        processes.append(real_spawn(*args, **kwargs))
        return processes[-1]

    monkeypatch.setattr(server_module, "spawn", recording_spawn)
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_context_manager_starts_a_ready_server_and_stops_it(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    with HttpServer() as server:
        assert server.running
        assert answers_http(server.port)
        assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
        pid, port, log_dir = server.pid, server.port, server.log_path.parent
        assert log_dir.is_dir()
    assert not is_alive(pid)
    assert not accepts_connections(port)
    assert not log_dir.exists()  # a temporary log directory goes with the server
    assert not server.running
    assert [p.pid for p in spawned] == [pid]


def test_start_stop_calls_and_given_log_dir_is_kept(tmp_path: Path) -> None:
    server = HttpServer(log_dir=tmp_path)
    with pytest.raises(LocalStackError, match="not started"):
        _ = server.endpoint_url
    server.start()
    try:
        with pytest.raises(LocalStackError, match="already started"):
            server.start()
        assert server.log_path == tmp_path / "fake-http.log"
    finally:
        server.stop()
    server.stop()  # idempotent
    assert (tmp_path / "fake-http.log").exists()


def test_server_that_exits_raises_with_its_output(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    server = CrashingServer(log_dir=tmp_path)
    with pytest.raises(ServerExitedError) as raised:
        server.start()
    error = raised.value
    assert "exited with code 3" in str(error)
    assert "config is broken" in error.log_tail
    assert "config is broken" in str(error)
    assert Path(error.log_path).read_text().strip() == "config is broken"
    assert error.server == "fake-crash"
    assert not server.running
    assert len(spawned) == 1  # not retried: the port was not the problem


def test_server_that_never_answers_times_out_and_is_stopped(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    server = SilentServer(startup_timeout=0.5, stop_timeout=1)
    with pytest.raises(ServerNotReadyError, match=r"within 0\.5 s"):
        server.start()
    assert not is_alive(spawned[0].pid)
    assert spawned[0].poll() is not None


def test_a_lost_port_race_is_retried_on_a_new_port(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    with UnluckyServer() as server:
        assert answers_http(server.port)
        assert len(spawned) == 2
        assert "EADDRINUSE" not in server.log_path.read_text()  # the log is this attempt's


def test_a_requested_port_is_not_swapped_for_another() -> None:
    with pytest.raises(ServerExitedError, match="EADDRINUSE"):
        UnluckyServer(port=1).start()


def test_server_environment_has_its_settings_but_no_credentials(tmp_path: Path) -> None:
    with EnvReportingServer(log_dir=tmp_path) as server:
        printed = server.log_path.read_text()
    assert "('FAKE_SETTING', 'on')" in printed
    assert "AWS_ACCESS_KEY_ID" not in printed  # set by tests/conftest.py, stripped for servers
    assert "AWS_SECRET_ACCESS_KEY" not in printed


def test_servers_left_running_are_stopped_at_exit_unless_detached(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    forgotten = HttpServer().start()
    detached = HttpServer(detach=True).start()
    try:
        server_module._stop_forgotten_servers()
        assert not is_alive(spawned[0].pid)
        assert is_alive(detached.pid)
    finally:
        forgotten.stop()
        detached.stop()
    assert not is_alive(spawned[1].pid)
