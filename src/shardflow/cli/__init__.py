"""The ``shardflow`` command. Each command group lives in its own module, the typer application
that ties them together in :mod:`shardflow.cli.commands` (``from shardflow.cli import app`` still
works: it is imported on first use).

``shardflow multilang`` with the arguments of a run is started without typer
(:mod:`shardflow.cli.multilang_run`): the daemon lives for months, and typer's imports (click,
rich, every other command, and pydantic, which typer loads to convert arguments) would stay in
its memory for nothing (11 MiB of RSS). Help, ``--check`` and anything the small parser does not
take go through the typer application as before.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardflow.cli.commands import app as app


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["multilang"]:
        from shardflow.cli.multilang_run import run_without_typer

        code = run_without_typer(argv[1:])
        if code is not None:
            sys.exit(code)
    from shardflow.cli.commands import app

    app()


def __getattr__(name: str) -> Any:
    if name == "app":
        from shardflow.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
