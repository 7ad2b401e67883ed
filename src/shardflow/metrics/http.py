"""The metrics port: Prometheus metrics, and the health probes an orchestrator asks.

``GET /metrics`` (and any other path) answers with the registry's metrics, as
prometheus-client's own server does. ``GET /healthz`` answers 200 while the client is live
and 503 otherwise; ``GET /readyz`` 200 while it is ready, 503 otherwise, the reasons in the
body, one a line (see :meth:`shardflow.Consumer.health`). Served from threads of its own, so a
busy or stuck event loop is what the probes report, not what keeps them from answering.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol, Self
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer


class HealthReport(Protocol):
    """What a probe needs of a health answer (:class:`shardflow.consumer` ``Health``)."""

    @property
    def live(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    def describe(self) -> str: ...


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: not a line each on stderr."""


class MetricsServer:
    """An HTTP server on ``host``:``port`` (0: any free port) for ``registry`` and, given
    ``health``, the probes; stop it with :meth:`close` (or use it as a context manager)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        health: Callable[[], HealthReport] | None = None,
    ) -> None:
        metrics = make_wsgi_app(registry)
        self._health = health

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in ("/healthz", "/readyz") and self._health is not None:
                report = self._health()
                good = report.live if path == "/healthz" else report.ready
                body = (
                    ("ok" if report.live else report.describe())
                    if path == "/healthz"
                    else report.describe()
                ).encode() + b"\n"
                status = "200 OK" if good else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
                return [body]
            return metrics(environ, start_response)  # type: ignore[no-any-return]

        self._server = make_server(
            host, port, app, server_class=ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="shardflow-metrics", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The address bound (host, port)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
