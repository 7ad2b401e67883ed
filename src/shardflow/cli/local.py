"""``shardflow local up|down|status``: the embedded local stack.

``up`` starts the servers detached (they outlive the command) and records their PIDs in a
state file; ``down`` stops exactly those PIDs; ``status`` probes them. The ``export`` lines
``up`` prints go to stdout unadorned, so ``eval "$(shardflow local up --quiet)"`` works.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shardflow.errors import LocalStackError
from shardflow.local.control import ServerState, server_state, stop_recorded
from shardflow.local.environment import client_environment, export_lines
from shardflow.local.stack import LocalStack
from shardflow.local.state import (
    DEFAULT_STATE_DIR,
    ServerRecord,
    read_state,
    state_file,
    write_state,
)

app = typer.Typer(
    help="Run the embedded local stack (moto, kinesis-local, kinesalite).", no_args_is_help=True
)

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        help="Directory for the state file (local.json) and the servers' logs.",
        file_okay=False,
    ),
]


@app.command()
def up(
    kinesis_local: Annotated[
        bool, typer.Option("--kinesis-local", help="Also run kinesis-local (resharding, EFO).")
    ] = False,
    kinesalite: Annotated[
        bool, typer.Option("--kinesalite", help="Also run kinesalite (throughput benchmarks).")
    ] = False,
    moto: Annotated[
        bool,
        typer.Option("--moto/--no-moto", help="Run moto's server (Kinesis, DynamoDB, CloudWatch)."),
    ] = True,
    port: Annotated[
        int | None, typer.Option("--port", help="moto's port (default: a free one).")
    ] = None,
    kinesis_local_port: Annotated[int | None, typer.Option(help="kinesis-local's port.")] = None,
    kinesalite_port: Annotated[int | None, typer.Option(help="kinesalite's port.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server.")] = 30.0,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the export lines.")
    ] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Start the local servers on 127.0.0.1 in the background and print how to reach them."""
    path = state_file(state_dir)
    running = [r for r in _read(path) or [] if server_state(r) is not ServerState.STOPPED]
    if running:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in running)
        _fail(
            f"a local stack is already running from {path}: {names}; "
            "see `shardflow local status` or stop it with `shardflow local down`"
        )
    try:
        stack = LocalStack(
            moto=moto,
            kinesis_local=kinesis_local,
            kinesalite=kinesalite,
            moto_port=port,
            kinesis_local_port=kinesis_local_port,
            kinesalite_port=kinesalite_port,
            startup_timeout=timeout,
            log_dir=state_dir.resolve() / "logs",
            detach=True,
        ).start()
    except LocalStackError as error:
        _fail(str(error))
    records = [ServerRecord.of(server) for server in stack.servers]
    try:
        write_state(path, records)
    except OSError as error:
        stack.stop()  # untracked servers could never be stopped by `down`
        _fail(f"cannot write {path}: {error}")
    env = client_environment(stack.endpoints(), os.environ)
    if not quiet:
        _out.print(_servers_table(records, states=None))
        _out.print(
            f"State in [bold]{escape(str(path))}[/]; stop with [bold]shardflow local down[/]."
        )
        _out.print("Point any AWS SDK at it:")
    for line in export_lines(env):
        typer.echo(line)


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop the servers recorded by `shardflow local up` (only those PIDs)."""
    path = state_file(state_dir)
    records = _read(path)
    if records is None:
        _out.print(f"No local stack recorded in {path}.")
        return
    for record in records:
        outcome = stop_recorded(record)
        _out.print(f"{record.name} (pid {record.pid}): {outcome}")
    path.unlink(missing_ok=True)


@app.command()
def status(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show each recorded server and whether it answers; exit 1 unless all are ready."""
    path = state_file(state_dir)
    records = _read(path)
    if records is None:
        _out.print(f"No local stack recorded in {path}; start one with `shardflow local up`.")
        raise typer.Exit(1)
    states = [server_state(record) for record in records]
    _out.print(_servers_table(records, states=states))
    ready = {r.name: r.endpoint_url for r, s in zip(records, states, strict=True) if s == "ready"}
    if ready:
        _out.print("Point any AWS SDK at it:")
        for line in export_lines(client_environment(ready, os.environ)):
            typer.echo(line)
    if len(ready) != len(records):
        raise typer.Exit(1)


def _servers_table(records: list[ServerRecord], *, states: list[ServerState] | None) -> Table:
    table = Table(title="shardflow local stack")
    for column in ("server", "endpoint", "pid", "state"):
        if column != "state" or states is not None:
            table.add_column(column, no_wrap=True)
    table.add_column("log", overflow="fold")  # the one column that may wrap on a narrow terminal
    for index, record in enumerate(records):
        cells = [record.name, record.endpoint_url, str(record.pid)]
        if states is not None:
            state = states[index]
            colour = "green" if state is ServerState.READY else "red"
            cells.append(f"[{colour}]{state}[/]")
        cells.append(record.log_path)
        table.add_row(*cells)
    return table


def _read(path: Path) -> list[ServerRecord] | None:
    try:
        return read_state(path)
    except LocalStackError as error:
        _fail(str(error))


def _fail(message: str) -> NoReturn:
    _err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(1)
