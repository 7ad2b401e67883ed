"""Start positions as the commands that read a stream take them on the command line."""

from __future__ import annotations

import typer

from shardflow.positions import StartPosition


def parse_start_position(text: str) -> StartPosition:
    """``text`` as a :class:`StartPosition` (see :meth:`StartPosition.parse`); a usage error
    naming what is wrong otherwise."""
    try:
        return StartPosition.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
