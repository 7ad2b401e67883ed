"""``shardflow multilang --properties-file app.properties``: the KCL's MultiLangDaemon, replaced.

Takes the MultiLangDaemon's own arguments (the properties file as ``--properties-file``, ``-p``
or a lone argument) and runs its record processors on shardflow's consumer (a plain run starts
without typer: :mod:`shardflow.cli.multilang_run`). Every key the file
sets that is not honoured as the KCL honours it is reported by name on stderr at start
(``--strict``: and the command refuses to run); ``--check`` only reports what the file means.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardflow.cli import aws_options
from shardflow.cli.aws_options import fail, stderr
from shardflow.cli.multilang_run import serve
from shardflow.multilang.config import MultiLangConfig, load_config
from shardflow.multilang.errors import PropertiesError


def multilang(
    properties: Annotated[
        Path | None,
        typer.Argument(
            metavar="[PROPERTIES]",
            help="The MultiLangDaemon properties file (as its lone argument).",
            show_default=False,
        ),
    ] = None,
    properties_file: Annotated[
        Path | None,
        typer.Option(
            "--properties-file",
            "--properties",
            "-p",
            help="The MultiLangDaemon properties file (its --properties-file).",
            show_default=False,
        ),
    ] = None,
    log_configuration: Annotated[
        str | None,
        typer.Option(
            "--log-configuration",
            "-l",
            help="The KCL's logback file: not read (use --log-level); accepted so that the "
            "KCL's command line works.",
            show_default=False,
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option("--check", help="Only show what the file means and what is not honoured."),
    ] = False,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Refuse to run when a key is not honoured as the KCL does."),
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
) -> None:
    """Run a MultiLangDaemon application (kclpy, aws-kcl for Node.js, ...) unchanged: one
    record processor per shard lease, leases in the KCL's table. SIGTERM or Ctrl-C stops it
    gracefully (processors checkpoint, leases handed over); a second one at once."""
    path = properties_file or properties
    if path is None:
        fail("a properties file is needed: shardflow multilang --properties-file FILE", code=2)
    try:
        config = load_config(path)
    except PropertiesError as exc:
        fail(f"{path}: {exc}", code=2)
    if log_configuration is not None:
        stderr.print(f"warning: --log-configuration {log_configuration}: not read (--log-level)")
    for note in config.notes:
        stderr.print(f"warning: {path}: {note}", markup=False)
    if check:
        _describe(config)
        return
    if strict and config.notes:
        fail(f"{len(config.notes)} key(s) not honoured as the KCL does (--strict)", code=2)
    code = serve(config, log_level, debug=aws_options.DEBUG)
    if code:
        raise typer.Exit(code)


def _describe(config: MultiLangConfig) -> None:
    retrieval = (
        f"polling (maxRecords {config.max_records}, idle {config.idle_time:g} s)"
        if config.retrieval == "POLLING"
        else f"enhanced fan-out (consumer {config.consumer_name or config.application})"
    )
    lines = [
        f"record processor   {' '.join(config.command)}",
        f"stream             {config.stream}",
        f"application        {config.application} (lease table {config.table_name})",
        f"worker id          {config.worker_id or '(hostname:pid:random)'}",
        f"region             {config.region or '(standard AWS configuration)'}",
        f"Kinesis endpoint   {config.kinesis_endpoint or '(standard AWS configuration)'}",
        f"DynamoDB endpoint  {config.dynamodb_endpoint or '(standard AWS configuration)'}",
        f"credentials        {'profile ' + config.profile if config.profile else 'standard chain'}",
        f"new shards start   {config.initial_position}",
        f"retrieval          {retrieval}",
        f"failover           {config.leases.failover_time:g} s",
        f"shutdown grace     {config.shutdown_grace:g} s",
        f"response timeout   {config.response_timeout:g} s"
        if config.response_timeout is not None
        else "response timeout   none",
        f"empty batches      {'yes' if config.empty_batches else 'no'}",
        f"keys not honoured  {len(config.notes)}",
    ]
    for line in lines:
        typer.echo(line)
