"""``shardflow stream create|list|describe|reshard|delete``."""

from __future__ import annotations

import typer

app = typer.Typer(help="Create, inspect, reshard and delete streams.", no_args_is_help=True)
