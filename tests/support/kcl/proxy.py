"""An HTTP/2-cleartext front for kinesalite, which the KCL's Kinesis client needs (h2c only)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from shardflow.errors import ServerExitedError, ServerNotReadyError
from shardflow.local.node import loopback_preload, node_executable
from shardflow.local.ports import accepts_connections
from shardflow.local.process import log_tail
from shardflow.local.server import LocalServer

_SCRIPT = Path(__file__).with_name("h2c_proxy.js")


class H2cProxy(LocalServer):
    """Forwards HTTP/2 cleartext requests on 127.0.0.1 to ``target`` as HTTP/1.1.

    ``with H2cProxy(kinesalite.endpoint_url) as proxy: proxy.endpoint_url`` is what the KCL's
    ``kinesisEndpoint`` gets. kinesis-local speaks h2c itself and needs no proxy.
    """

    name: ClassVar[str] = "h2c-proxy"
    default_stop_timeout: ClassVar[float] = 2.0

    def __init__(self, target: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.target = target

    def _build_command(self, port: int) -> list[str]:
        script = [str(_SCRIPT), str(port), self.target]
        return [node_executable(), "-r", str(loopback_preload()), *script]

    def _wait_for_http(self) -> None:
        # It answers HTTP/2 only, so an HTTP/1.1 probe would never see an answer: a TCP accept
        # is the readiness signal (the script listens only once everything is set up).
        assert self._process is not None, "launch() first"
        deadline = time.monotonic() + self.startup_timeout
        while not accepts_connections(self.port):
            where = {"log_path": str(self.log_path), "log_tail": log_tail(self.log_path)}
            if self._process.poll() is not None:
                raise ServerExitedError(self.name, "exited before listening", **where)
            if time.monotonic() >= deadline:
                raise ServerNotReadyError(self.name, "not listening", **where)
            time.sleep(0.05)
