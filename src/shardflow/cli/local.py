"""``shardflow local up|down|status``: the embedded local stack."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Run the embedded local stack (moto, kinesis-local, kinesalite).", no_args_is_help=True
)
