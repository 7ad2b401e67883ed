"""The ``shardflow`` command. Each command group lives in its own module."""

from __future__ import annotations

import typer

from shardflow.cli import consume, dlq, leases, local, produce, streams, tail

app = typer.Typer(
    name="shardflow",
    help="Kinesis Data Streams from Python: local stack, streams, producer, tail.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals could hold credentials
)
app.add_typer(local.app, name="local")
app.add_typer(streams.app, name="stream")
app.command("produce")(produce.produce)
app.command("tail")(tail.tail)
app.command("consume")(consume.consume)
app.command("leases")(leases.leases)
app.add_typer(dlq.app, name="dlq")


def main() -> None:
    app()
