"""Several local servers started and stopped together."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from shardflow.errors import LocalStackError
from shardflow.local.environment import client_environment
from shardflow.local.server import LocalServer
from shardflow.local.servers import KinesaliteServer, KinesisLocalServer, MotoServer

_Server = TypeVar("_Server", bound=LocalServer)


class LocalStack:
    """moto's server and, on request, kinesis-local and kinesalite, all on 127.0.0.1.

    >>> with LocalStack(kinesis_local=True) as stack:  # doctest: +SKIP
    ...     boto3.client("kinesis", endpoint_url=stack.moto.endpoint_url)
    ...     os.environ.update(stack.env())

    The servers start side by side; if one fails, all are stopped and the error (with the tail
    of that server's log) is raised. Options are passed to each server (see
    :class:`~shardflow.local.LocalServer`); ports default to free ones.
    """

    def __init__(
        self,
        *,
        moto: bool = True,
        kinesis_local: bool = False,
        kinesalite: bool = False,
        moto_port: int | None = None,
        kinesis_local_port: int | None = None,
        kinesalite_port: int | None = None,
        startup_timeout: float = 30.0,
        log_dir: Path | str | None = None,
        detach: bool = False,
    ) -> None:
        servers: list[LocalServer] = []
        if moto:
            servers.append(
                MotoServer(
                    port=moto_port, startup_timeout=startup_timeout, log_dir=log_dir, detach=detach
                )
            )
        if kinesis_local:
            servers.append(
                KinesisLocalServer(
                    port=kinesis_local_port,
                    startup_timeout=startup_timeout,
                    log_dir=log_dir,
                    detach=detach,
                )
            )
        if kinesalite:
            servers.append(
                KinesaliteServer(
                    port=kinesalite_port,
                    startup_timeout=startup_timeout,
                    log_dir=log_dir,
                    detach=detach,
                )
            )
        if not servers:
            raise LocalStackError("a local stack needs at least one server")
        self.servers: tuple[LocalServer, ...] = tuple(servers)

    @property
    def moto(self) -> MotoServer:
        """moto's server (Kinesis, DynamoDB, DynamoDB Streams, CloudWatch)."""
        return self._get(MotoServer)

    @property
    def kinesis_local(self) -> KinesisLocalServer:
        """kinesis-local, if the stack was created with ``kinesis_local=True``."""
        return self._get(KinesisLocalServer)

    @property
    def kinesalite(self) -> KinesaliteServer:
        """kinesalite, if the stack was created with ``kinesalite=True``."""
        return self._get(KinesaliteServer)

    def endpoints(self) -> dict[str, str]:
        """Server name → endpoint URL of every server."""
        return {server.name: server.endpoint_url for server in self.servers}

    def env(self, current: Mapping[str, str] | None = None) -> dict[str, str]:
        """Variables that point AWS SDKs at this stack (rules in ``shardflow.local.environment``).

        ``current`` is the environment they will be added to; default ``os.environ``.
        """
        return client_environment(self.endpoints(), os.environ if current is None else current)

    def start(self) -> Self:
        """Start every server and wait until all answer HTTP; on failure stop them all."""
        try:
            for server in self.servers:
                server.launch()
            for server in self.servers:
                server.wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server that runs. Idempotent."""
        for server in reversed(self.servers):
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _get(self, kind: type[_Server]) -> _Server:
        for server in self.servers:
            if isinstance(server, kind):
                return server
        raise LocalStackError(f"{kind.name} is not part of this local stack")
