"""Blocking entry points: run a consumer in the current thread until a signal or stop().

::

    from shardflow.consumer import run_consumer

    def handle(record):
        print(record.value)

    run_consumer("orders", "billing", handle)   # SIGTERM / Ctrl-C stop it gracefully
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardflow.consumer.handlers import Handler
from shardflow.consumer.signals import install_stop_signals

if TYPE_CHECKING:
    from shardflow.consumer.consumer import Consumer
    from shardflow.consumer.dispatch.dead_letters import DeadLetters


def run_blocking(
    consumer: Consumer,
    handler: Handler,
    *,
    batch: bool = False,
    auto_ack: bool = True,
    handle_signals: bool = True,
    dead_letters: DeadLetters | None = None,
) -> None:
    """Run ``consumer.consume(handler)`` on a new event loop until it stops.

    With ``handle_signals`` SIGTERM and SIGINT stop it gracefully (a second one at once; the
    run then raises :class:`asyncio.CancelledError`).
    """

    async def main() -> None:
        uninstall = install_stop_signals(consumer.request_stop) if handle_signals else None
        try:
            await consumer.consume(
                handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters
            )
        finally:
            if uninstall is not None:
                uninstall()

    asyncio.run(main())


def run_consumer(
    stream: str | Sequence[str],
    application_name: str,
    handler: Handler,
    *,
    batch: bool = False,
    auto_ack: bool = True,
    dead_letters: DeadLetters | None = None,
    **options: Any,
) -> None:
    """Build a :class:`~shardflow.consumer.Consumer` (``options`` as its keyword arguments) and
    run it until SIGTERM, SIGINT or ``stop()``."""
    from shardflow.consumer.consumer import Consumer

    consumer = Consumer(stream, application_name, **options)
    run_blocking(consumer, handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters)
