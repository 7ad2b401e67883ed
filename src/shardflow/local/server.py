"""One emulator process on 127.0.0.1: start, wait until it answers, stop.

Subclasses (``servers.py``) only say which command to run and with which environment.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from shardflow.errors import LocalStackError, ServerExitedError, ServerNotReadyError
from shardflow.local.ports import LOOPBACK, free_port
from shardflow.local.process import log_tail, spawn, terminate
from shardflow.local.readiness import answers_http

#: Emulators never need real credentials; keep them out of their environment (and logs).
_SECRET_ENV = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
    }
)
#: What a server prints when another process took its port between our probe and its bind.
_PORT_TAKEN_MARKERS = ("EADDRINUSE", "Address already in use")
_PORT_ATTEMPTS = 3
_PROBE_INTERVAL_SECONDS = 0.05


class LocalServer(ABC):
    """An emulator listening on 127.0.0.1, run as a child process.

    Use as a context manager (``with MotoServer() as server: server.endpoint_url``) or call
    :meth:`start` and :meth:`stop`. ``port=None`` picks a free port. Output goes to
    ``<log_dir>/<name>.log``; without ``log_dir`` a temporary directory is used and removed
    by :meth:`stop`. A ``detach``-ed server runs in its own session and outlives this process
    (the CLI uses that); any other server still running when Python exits is stopped then.
    """

    #: Short name used in logs, errors, state files and environment variable names.
    name: ClassVar[str]
    #: Seconds between SIGTERM and SIGKILL when ``stop_timeout`` is not given.
    default_stop_timeout: ClassVar[float] = 5.0

    def __init__(
        self,
        *,
        port: int | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float | None = None,
        log_dir: Path | str | None = None,
        detach: bool = False,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.stop_timeout = self.default_stop_timeout if stop_timeout is None else stop_timeout
        self.detach = detach
        self._requested_port = port
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._temporary_log_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._command: list[str] = []

    # --- what subclasses provide ------------------------------------------------------------

    @abstractmethod
    def _build_command(self, port: int) -> list[str]:
        """The argument vector that starts the server on ``port``; raises if not installed."""

    def _build_env(self, port: int) -> dict[str, str]:
        """Extra environment variables for the server process."""
        return {}

    # --- state ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port the server listens on (127.0.0.1)."""
        if self._port is None:
            raise LocalStackError(f"{self.name} is not started")
        return self._port

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``, for ``endpoint_url=`` of an AWS SDK client."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        """The process id of the server."""
        if self._process is None:
            raise LocalStackError(f"{self.name} is not started")
        return self._process.pid

    @property
    def command(self) -> list[str]:
        """The argument vector the server runs with (identifies its PID later)."""
        return list(self._command)

    @property
    def log_path(self) -> Path:
        """The file the server's stdout and stderr go to."""
        log_dir = self._log_dir or self._temporary_log_dir
        if log_dir is None:
            raise LocalStackError(f"{self.name} is not started")
        return log_dir / f"{self.name}.log"

    @property
    def running(self) -> bool:
        """Whether the server process was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and wait until it answers HTTP requests.

        Raises :class:`~shardflow.errors.EmulatorNotInstalledError` when it is not installed,
        :class:`~shardflow.errors.ServerExitedError` or
        :class:`~shardflow.errors.ServerNotReadyError` (with the tail of its log) when it does
        not come up; nothing is left running then.
        """
        self.launch()
        self.wait_until_ready()
        return self

    def launch(self) -> None:
        """Start the server process without waiting for it (see :meth:`wait_until_ready`)."""
        if self._process is not None:
            raise LocalStackError(f"{self.name} is already started (pid {self._process.pid})")
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise
        if not self.detach:
            _LIVE_SERVERS.add(self)

    def wait_until_ready(self) -> None:
        """Block until the launched server answers HTTP, or stop it and raise."""
        try:
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                try:
                    self._wait_for_http()
                    return
                except ServerExitedError as error:
                    if not self._may_retry_port(error, attempt):
                        raise
                    self._process = None
                    self._spawn()
        except BaseException:
            self._shut_down(keep_log=True)  # the error names the log file: keep it
            raise

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_timeout`` s). Idempotent.

        The default ``stop_timeout`` is the class's :attr:`default_stop_timeout`.
        """
        self._shut_down(keep_log=False)

    def _shut_down(self, *, keep_log: bool) -> None:
        process, self._process = self._process, None
        _LIVE_SERVERS.discard(self)
        if process is not None:
            terminate(process.pid, timeout=self.stop_timeout)
            process.poll()  # settle the Popen object now that the PID is gone
        if self._temporary_log_dir is not None:
            if not keep_log:
                shutil.rmtree(self._temporary_log_dir, ignore_errors=True)
            self._temporary_log_dir = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.endpoint_url if self._port is not None else "not started"
        return f"<{type(self).__name__} {where}>"

    # --- internals --------------------------------------------------------------------------

    def _spawn(self) -> None:
        port = self._requested_port or free_port()
        self._command = self._build_command(port)
        if self._log_dir is None and self._temporary_log_dir is None:
            self._temporary_log_dir = Path(tempfile.mkdtemp(prefix=f"shardflow-{self.name}-"))
        env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
        env.update(self._build_env(port))
        # Truncate the log on every launch: an error shows this attempt's output only.
        self.log_path.unlink(missing_ok=True)
        self._process = spawn(self._command, env=env, log_path=self.log_path, detach=self.detach)
        self._port = port

    def _wait_for_http(self) -> None:
        assert self._process is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        while True:
            returncode = self._process.poll()
            if returncode is not None:
                raise ServerExitedError(
                    self.name,
                    f"exited with code {returncode} before answering on port {self.port}",
                    log_path=str(self.log_path),
                    log_tail=log_tail(self.log_path),
                )
            remaining = deadline - time.monotonic()
            if answers_http(self.port, timeout=max(0.1, min(1.0, remaining))):
                return
            if time.monotonic() >= deadline:
                raise ServerNotReadyError(
                    self.name,
                    f"no HTTP answer on port {self.port} within {self.startup_timeout:g} s",
                    log_path=str(self.log_path),
                    log_tail=log_tail(self.log_path),
                )
            time.sleep(_PROBE_INTERVAL_SECONDS)

    def _may_retry_port(self, error: ServerExitedError, attempt: int) -> bool:
        lost_race = any(marker in error.log_tail for marker in _PORT_TAKEN_MARKERS)
        return lost_race and self._requested_port is None and attempt < _PORT_ATTEMPTS


#: Non-detached servers not yet stopped; stopped at interpreter exit as a last resort.
_LIVE_SERVERS: set[LocalServer] = set()


@atexit.register
def _stop_forgotten_servers() -> None:
    for server in list(_LIVE_SERVERS):
        server.stop()
