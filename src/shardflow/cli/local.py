"""``shardflow local up|down|status``: the embedded local stack.

``up`` starts the servers detached (they outlive the command) and records their PIDs in this
user's state file; ``down`` stops exactly those PIDs; ``status`` probes them. The ``export``
lines ``up`` prints go to stdout unadorned, so ``eval "$(shardflow local up --quiet)"`` works,
also when the stack runs already (``up`` then prints its environment and starts nothing).
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
    ServerRecord,
    default_state_dir,
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
    Path | None,
    typer.Option(
        "--state-dir",
        help="Directory for the state file (local.json) and the servers' logs "
        "(default: $SHARDFLOW_STATE_DIR, $XDG_STATE_HOME/shardflow or ~/.local/state/shardflow).",
        file_okay=False,
        show_default=False,
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
    state_dir: StateDir = None,
) -> None:
    """Start the local servers on 127.0.0.1 in the background and print how to reach them.

    With a stack running already, print its environment again and start nothing.
    """
    state_dir = state_dir or default_state_dir()
    path = state_file(state_dir)
    recorded = _read(path) or []
    running = [r for r in recorded if server_state(r) is not ServerState.STOPPED]
    if running:
        wanted = {"moto": moto, "kinesis-local": kinesis_local, "kinesalite": kinesalite}
        have = {r.name for r in running}
        missing = [name for name, on in wanted.items() if on and name not in have]
        missing += [f"{r.name} (stopped)" for r in recorded if r not in running]
        if missing:
            names = ", ".join(f"{r.name} (pid {r.pid})" for r in running)
            _fail(
                f"a local stack is already running ({names}) without {', '.join(missing)}; "
                "stop it with `shardflow local down`, then run `up` again"
            )
        if not quiet:
            _out.print(_servers_table(running, states=None))
            _out.print(f"Already running (state in [bold]{escape(str(path))}[/]).")
            _out.print("Point any AWS SDK at it:")
        _print_exports({r.name: r.endpoint_url for r in running})
        return
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
    if not quiet:
        _out.print(_servers_table(records, states=None))
        _out.print(
            f"State in [bold]{escape(str(path))}[/]; stop with [bold]shardflow local down[/]."
        )
        _out.print("Point any AWS SDK at it:")
    _print_exports(stack.endpoints())


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop the servers recorded by `shardflow local up` (only those PIDs)."""
    path = state_file(state_dir or default_state_dir())
    records = _read(path)
    if records is None:
        _out.print(f"No local stack recorded in {path}.")
        return
    for record in records:
        outcome = stop_recorded(record)
        _out.print(f"{record.name} (pid {record.pid}): {outcome}")
    path.unlink(missing_ok=True)


@app.command()
def status(state_dir: StateDir = None) -> None:
    """Show each recorded server and whether it answers; exit 1 unless all are ready."""
    path = state_file(state_dir or default_state_dir())
    records = _read(path)
    if records is None:
        _out.print(f"No local stack recorded in {path}; start one with `shardflow local up`.")
        raise typer.Exit(1)
    states = [server_state(record) for record in records]
    _out.print(_servers_table(records, states=states))
    ready = {r.name: r.endpoint_url for r, s in zip(records, states, strict=True) if s == "ready"}
    if ready:
        _out.print("Point any AWS SDK at it:")
        _print_exports(ready)
    if len(ready) != len(records):
        raise typer.Exit(1)


def _print_exports(endpoints: dict[str, str]) -> None:
    for line in export_lines(client_environment(endpoints, os.environ)):
        typer.echo(line)


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
