"""Blocking entry point: build a consumer and run it in the current thread until a signal or close().

::

    from shardflow import run_consumer

    def handle(record):
        print(record.value)

    run_consumer("orders", "billing", handle)   # SIGTERM / Ctrl-C stop it gracefully
"""

from __future__ import annotations

from collections.abc import Sequence

from shardflow.aws.clients import ClientFactory
from shardflow.aws.settings import AwsSettings
from shardflow.consumer.consumer import Consumer
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.delivery.dead_letters import DeadLetters
from shardflow.consumer.lifecycle.supervisor import ErrorCallback
from shardflow.consumer.settings import ConsumerSettings
from shardflow.events import EventCallback
from shardflow.leases.store import LeaseStore


def run_consumer(
    stream: str | Sequence[str],
    application_name: str,
    handler: Handler,
    *,
    batch: bool = False,
    auto_ack: bool = True,
    dead_letters: DeadLetters | None = None,
    settings: ConsumerSettings | None = None,
    aws: AwsSettings | None = None,
    clients: ClientFactory | None = None,
    lease_store: LeaseStore | None = None,
    on_event: EventCallback | None = None,
    on_error: ErrorCallback | None = None,
) -> None:
    """Build a :class:`~shardflow.Consumer` (the keyword arguments after ``dead_letters`` are
    its own) and run it until SIGTERM, SIGINT or ``close()`` (see
    :meth:`~shardflow.Consumer.run`)."""
    consumer = Consumer(
        stream,
        application_name,
        settings=settings,
        aws=aws,
        clients=clients,
        lease_store=lease_store,
        on_event=on_event,
        on_error=on_error,
    )
    consumer.run(handler, batch=batch, auto_ack=auto_ack, dead_letters=dead_letters)
