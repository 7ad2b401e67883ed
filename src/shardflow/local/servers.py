"""The emulators: moto's server, kinesis-local, kinesalite and dynalite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import ClassVar

from shardflow.errors import EmulatorNotInstalledError, LocalStackError
from shardflow.local.node import find_package, loopback_preload, node_executable
from shardflow.local.ports import free_port
from shardflow.local.server import LocalServer


class MotoServer(LocalServer):
    """moto's server: Kinesis, DynamoDB, DynamoDB Streams and CloudWatch on one port.

    The embedded default for the demo and most tests. Needs ``pip install 'shardflow[local]'``.
    Requests are processed one at a time (:mod:`shardflow.local.moto_serial`).
    """

    name: ClassVar[str] = "moto"

    def _build_command(self, port: int) -> list[str]:
        for module in ("moto", "flask"):  # flask comes with the [server] extra
            if importlib.util.find_spec(module) is None:
                raise EmulatorNotInstalledError(
                    f"moto's server needs the Python package {module!r}; "
                    "install it with `pip install 'shardflow[local]'` (or `make setup`)"
                )
        # Served one request at a time: moto's backends are not thread-safe (see moto_serial).
        return [sys.executable, "-m", "shardflow.local.moto_serial", "-p", str(port)]


class _NodeServer(LocalServer):
    """An npm emulator run by ``node`` with the loopback preload script."""

    package: ClassVar[str]
    script: ClassVar[str]

    def __init__(
        self,
        *,
        port: int | None = None,
        shard_limit: int = 1000,
        transition_ms: int = 0,
        node_modules_start: Path | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float | None = None,
        log_dir: Path | str | None = None,
        detach: bool = False,
    ) -> None:
        """``node_modules_start``: where to start looking for node_modules (see ``find_package``)."""
        super().__init__(
            port=port,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            log_dir=log_dir,
            detach=detach,
        )
        self.shard_limit = shard_limit
        self.transition_ms = transition_ms
        self._node_modules_start = node_modules_start

    def _build_command(self, port: int) -> list[str]:
        package_dir = find_package(self.package, start=self._node_modules_start)
        node = node_executable()
        script = package_dir / self.script
        return [node, "-r", str(loopback_preload()), str(script), *self._script_args(port)]

    def _script_args(self, port: int) -> list[str]:
        return []


class KinesisLocalServer(_NodeServer):
    """kinesis-local (a build of kinesis-mock): the most faithful Kinesis stand-in.

    Use it for resharding (ChildShards, shard end) and enhanced fan-out. Streams change state
    after ``transition_ms`` (create, delete, reshard, consumer registration...); up to
    ``shard_limit`` shards. It also serves TLS on :attr:`tls_port`.
    """

    name: ClassVar[str] = "kinesis-local"
    package: ClassVar[str] = "kinesis-local"
    script: ClassVar[str] = "main.js"
    # Its graceful shutdown waits for every open keep-alive connection (an SDK client that was
    # not closed, an enhanced fan-out subscription), and it keeps no data: do not wait long.
    default_stop_timeout: ClassVar[float] = 1.0

    #: Every delay kinesis-local applies before a stream or consumer changes state.
    TRANSITION_SETTINGS: ClassVar[tuple[str, ...]] = (
        "CREATE_STREAM_DURATION",
        "DELETE_STREAM_DURATION",
        "REGISTER_STREAM_CONSUMER_DURATION",
        "DEREGISTER_STREAM_CONSUMER_DURATION",
        "MERGE_SHARDS_DURATION",
        "SPLIT_SHARD_DURATION",
        "START_STREAM_ENCRYPTION_DURATION",
        "STOP_STREAM_ENCRYPTION_DURATION",
        "UPDATE_SHARD_COUNT_DURATION",
        "UPDATE_STREAM_MODE_DURATION",
    )

    _tls_port: int | None = None

    @property
    def tls_port(self) -> int:
        """The port of kinesis-local's TLS listener (self-signed certificate)."""
        if self._port is None or self._tls_port is None:
            raise LocalStackError(f"{self.name} is not started")
        return self._tls_port

    def _build_env(self, port: int) -> dict[str, str]:
        self._tls_port = free_port()
        package_dir = find_package(self.package, start=self._node_modules_start)
        env = {
            "KINESIS_MOCK_PLAIN_PORT": str(port),
            "KINESIS_MOCK_TLS_PORT": str(self._tls_port),
            # Without it kinesis-local looks for server.json in the current directory.
            "KINESIS_MOCK_CERT_PATH": str(package_dir / "server.json"),
            "SHARD_LIMIT": str(self.shard_limit),
            "ON_DEMAND_STREAM_COUNT_LIMIT": "50",  # the AWS default; kinesis-local's is 10
            "SHOULD_PERSIST_DATA": "false",
            "LOG_LEVEL": "ERROR",
        }
        env.update({setting: f"{self.transition_ms}ms" for setting in self.TRANSITION_SETTINGS})
        return env


class KinesaliteServer(_NodeServer):
    """kinesalite: in-memory Kinesis whose write speed holds as a stream fills (benchmarks).

    No on-demand streams, consumers or UpdateShardCount; lag is always reported as zero.
    """

    name: ClassVar[str] = "kinesalite"
    package: ClassVar[str] = "kinesalite"
    script: ClassVar[str] = "cli.js"

    def _script_args(self, port: int) -> list[str]:
        delay = str(self.transition_ms)
        return [
            "--port",
            str(port),
            "--createStreamMs",
            delay,
            "--deleteStreamMs",
            delay,
            "--updateStreamMs",
            delay,
            "--shardLimit",
            str(self.shard_limit),
        ]


class DynaliteServer(_NodeServer):
    """dynalite: an in-memory DynamoDB (conditional writes included) that answers many
    requests at once, for benchmarks whose lease table would saturate moto's serialized
    server (~110 conditional writes/s). No DynamoDB Streams: lease pick-up polls the table.
    """

    name: ClassVar[str] = "dynalite"
    package: ClassVar[str] = "dynalite"
    script: ClassVar[str] = "cli.js"

    def _script_args(self, port: int) -> list[str]:
        delay = str(self.transition_ms)
        return [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--createTableMs",
            delay,
            "--deleteTableMs",
            delay,
            "--updateTableMs",
            delay,
        ]
