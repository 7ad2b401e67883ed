"""Blocking entry point: build a consumer and run it in the current thread until a signal or stop().

::

    from shardflow import run_consumer

    def handle(record):
        print(record.value)

    run_consumer("orders", "billing", handle)   # SIGTERM / Ctrl-C stop it gracefully
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardflow.consumer.consumer import Consumer
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.delivery.dead_letters import DeadLetters


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
    """Build a :class:`~shardflow.Consumer` (``options`` as its keyword arguments) and run it
    until SIGTERM, SIGINT or ``stop()`` (see :meth:`~shardflow.Consumer.run`)."""
    consumer = Consumer(stream, application_name, **options)
    consumer.run(handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters)
