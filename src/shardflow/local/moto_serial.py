"""moto's server with one request at a time: ``python -m shardflow.local.moto_serial -p PORT``.

moto's backends are not thread-safe, and its server handles each connection on a thread of its
own. Two PutRecords at once can then be given the same sequence number, and one record silently
replaces the other; two conditional DynamoDB writes at once can both see their condition hold.
Real Kinesis and DynamoDB do neither, and shardflow's tests would misjudge the code under test.
This launcher serves moto's application behind a lock: connections are still accepted in
parallel (keep-alive works), but requests are processed one after another, which is what makes
each DynamoDB write atomic, as it is on AWS. It always binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterable
from typing import Any

from shardflow.local.ports import LOOPBACK

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class SerializedApp:
    """A WSGI application that lets one request at a time through to ``app``."""

    def __init__(self, app: WsgiApp) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            body = self._app(environ, start_response)
            try:
                # moto builds whole responses; drain inside the lock so none of the work
                # escapes it.
                return list(body)
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple(LOOPBACK, args.port, SerializedApp(app), threaded=True, use_reloader=False)


if __name__ == "__main__":
    main()
