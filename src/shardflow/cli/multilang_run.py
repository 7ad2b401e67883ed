"""Running ``shardflow multilang``: the daemon's start, shared by the typer command and the lean
start that skips typer (see :mod:`shardflow.cli`).

:func:`run_without_typer` reads the command's arguments with :mod:`argparse` (stdlib, already
imported by the SDK) only when they ask for a run: help, ``--check`` and any argument it does
not take as the typer command does return None, and the typer application takes over, so
there is one place for what the options mean and one for their help. Messages are the typer
command's, as plain lines on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import NoReturn

from botocore.exceptions import BotoCoreError

from shardflow.aws.redaction import redact
from shardflow.cli.failures import one_line
from shardflow.errors import ShardflowError
from shardflow.multilang.config import MultiLangConfig, load_config
from shardflow.multilang.daemon import MultiLangDaemon
from shardflow.multilang.errors import PropertiesError
from shardflow.multilang.memory import release_large_buffers

log = logging.getLogger("shardflow.cli")


class _NotARun(Exception):
    """The arguments are not a plain run: the typer command reads (and reports) them."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _NotARun(message)  # argparse would print its usage and exit: typer's to say


def run_without_typer(argv: list[str]) -> int | None:
    """Run the daemon for ``shardflow multilang ARGV`` and return its exit status; None when
    the arguments are not a plain run (the typer command handles them)."""
    parser = _Parser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("properties", nargs="?")
    parser.add_argument("--properties-file", "--properties", "-p", dest="properties_file")
    parser.add_argument("--log-configuration", "-l")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--log-level", default="info")
    if any(arg in ("--help", "-h", "--check") or arg.startswith("--help") for arg in argv):
        return None
    try:
        args, rest = parser.parse_known_args(argv)
    except (argparse.ArgumentError, _NotARun):
        return None
    path_text = args.properties_file or args.properties
    if rest or not path_text:
        return None
    path = Path(path_text)
    try:
        config = load_config(path)
    except PropertiesError as exc:
        return error(f"{path}: {exc}", 2)
    if args.log_configuration is not None:
        warn(f"--log-configuration {args.log_configuration}: not read (--log-level)")
    for note in config.notes:
        warn(f"{path}: {note}")
    if args.strict and config.notes:
        return error(f"{len(config.notes)} key(s) not honoured as the KCL does (--strict)", 2)
    return serve(config, args.log_level)


def serve(config: MultiLangConfig, log_level: str, *, debug: bool = False) -> int:
    """Run the daemon until a signal; its exit status (``debug``: errors raise)."""
    level = getattr(logging, log_level.upper(), logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for sdk in ("botocore", "aiobotocore"):
        logging.getLogger(sdk).setLevel(max(level, logging.WARNING))
    release_large_buffers()  # megabyte GetRecords answers: freed to the system, not the heap
    try:
        asyncio.run(_serve(MultiLangDaemon(config)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    except (ShardflowError, BotoCoreError, TimeoutError) as exc:
        if debug:
            raise
        return error(one_line(exc), 1)
    return 0


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def error(message: str, code: int) -> int:
    """Print ``error: message`` (credentials masked) on stderr; ``code``."""
    print(f"error: {redact(message)}", file=sys.stderr, flush=True)
    return code


async def _serve(daemon: MultiLangDaemon) -> None:
    """The daemon until a signal: the first stops it gracefully, the second at once."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("stopping: processors checkpoint, leases are handed over")
            daemon.request_stop()
        elif task is not None:
            task.cancel()

    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, on_signal)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        await daemon.run()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
