"""The typer application of the ``shardflow`` command: every command, with its help."""

from __future__ import annotations

from typing import Annotated

import typer

from shardflow.cli import (
    aws_options,
    consume,
    dlq,
    leases,
    local,
    multilang,
    produce,
    streams,
    tail,
)

app = typer.Typer(
    name="shardflow",
    help="Kinesis Data Streams from Python: run a local stack, create and inspect streams, "
    "produce, tail, consume with a handler or with MultiLangDaemon record processors, show an "
    "application's leases, and show or replay dead letters.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals could hold credentials
)


@app.callback()
def _options(
    debug: Annotated[
        bool,
        typer.Option("--debug", help="On an error, show the traceback, not only its one line."),
    ] = False,
) -> None:
    aws_options.DEBUG = debug


app.add_typer(local.app, name="local")
app.add_typer(streams.app, name="stream")
app.command("produce")(produce.produce)
app.command("tail")(tail.tail)
app.command("consume")(consume.consume)
app.command("leases")(leases.leases)
app.command("multilang")(multilang.multilang)
app.add_typer(dlq.app, name="dlq")
