"""``shardflow consume MODULE:FUNCTION``: run a handler over streams as a KCL-compatible worker."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Iterator
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer

from shardflow.aws.clients import ClientFactory
from shardflow.aws.settings import AwsSettings
from shardflow.cli import aws_options
from shardflow.cli.aws_options import (
    EndpointUrl,
    ExternalId,
    Profile,
    Region,
    RoleArn,
    RoleSessionName,
    aws_settings,
    fail,
    run,
    stream_role,
)
from shardflow.cli.dispatch_options import (
    Attempts,
    BisectOption,
    DeadLettersOption,
    MaxInFlight,
    MaxRecordAgeOption,
    OnFailure,
    OnFailureOption,
    OrderingOption,
    dead_letter_target,
    dispatch_settings,
    open_dead_letters,
)
from shardflow.cli.positions import parse_start_position
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.consumer import Consumer
from shardflow.consumer.delivery.calls import Handler
from shardflow.consumer.lifecycle.signals import install_stop_signals
from shardflow.consumer.settings import ConsumerSettings
from shardflow.fetch import FanOut, Polling
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings
from shardflow.leases.store import LeaseStore
from shardflow.metrics import ConsumerCollector, MetricsServer
from shardflow.records import Deserializer, as_bytes, as_json, as_utf8

log = logging.getLogger("shardflow.cli")


class DeserializerName(StrEnum):
    BYTES = "bytes"
    UTF8 = "utf8"
    JSON = "json"


class FetchName(StrEnum):
    POLLING = "polling"
    EFO = "efo"


class OnError(StrEnum):
    STOP_SHARD = "stop-shard"
    STOP_CONSUMER = "stop-consumer"


_DESERIALIZERS: dict[DeserializerName, Deserializer[Any]] = {
    DeserializerName.BYTES: as_bytes,
    DeserializerName.UTF8: as_utf8,
    DeserializerName.JSON: as_json,
}

LeaseEndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--lease-endpoint-url",
        help="Endpoint URL of DynamoDB for the lease table (default: --endpoint-url).",
        show_default=False,
    ),
]


def load_handler(target: str) -> Handler:
    """The callable named ``module:attribute`` (``attribute`` may be dotted), importable from
    the current directory too."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise typer.BadParameter(f"expected MODULE:FUNCTION, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself failed: a SyntaxError, or raised at import
        if aws_options.DEBUG:
            raise
        raise typer.BadParameter(
            f"cannot import module {module_name!r}: {_raised_at_import(exc)}"
        ) from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise typer.BadParameter(f"module {module_name!r} has no {attribute!r}") from None
    if not callable(found):
        raise typer.BadParameter(f"{target} is not callable")
    handler: Handler = found
    return handler


def _raised_at_import(exc: Exception) -> str:
    """What a module raised at import, and where: the line of the innermost frame in a file of
    the user's (``shardflow --debug consume ...`` shows the whole traceback)."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno} of {exc.filename})"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    where = f" (line {ours[-1].lineno} of {ours[-1].filename})" if ours else ""
    return f"{type(exc).__name__}: {exc}{where}"


def consume(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:FUNCTION",
            help="The handler: a function (async or not) taking one record, or a list with "
            "--batch. Records have .value (deserialized), .data, .partition_key, "
            ".sequence_number, .shard_id. Imported from the current directory too.",
            show_default=False,
        ),
    ],
    streams: Annotated[
        list[str],
        typer.Option("--stream", "-s", help="Stream name or ARN; repeat for several streams."),
    ],
    application: Annotated[
        str,
        typer.Option(
            "--app", "-a", help="Application name: the lease table shared by its workers."
        ),
    ],
    batch: Annotated[
        bool,
        typer.Option("--batch/--per-record", help="Call the handler with lists of records."),
    ] = False,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="Where a new application starts: trim-horizon, latest or an ISO timestamp. "
            "Existing checkpoints always win.",
        ),
    ] = "trim-horizon",
    worker_id: Annotated[
        str | None,
        typer.Option("--worker-id", help="This worker's id (default hostname:pid:random)."),
    ] = None,
    deserializer: Annotated[
        DeserializerName, typer.Option("--deserializer", help="What record.value is.")
    ] = DeserializerName.BYTES,
    checkpoint_every: Annotated[
        int | None,
        typer.Option("--checkpoint-every", min=1, help="Checkpoint after this many records."),
    ] = 1000,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-interval", min=0.001, help="Checkpoint at least this often (s)."
        ),
    ] = 5.0,
    fetch: Annotated[
        FetchName, typer.Option("--fetch", help="GetRecords polling or enhanced fan-out.")
    ] = FetchName.POLLING,
    efo_consumer_name: Annotated[
        str | None,
        typer.Option("--efo-consumer", help="Fan-out consumer name (default: the app name)."),
    ] = None,
    idle_time: Annotated[
        float,
        typer.Option("--idle-time", min=0.0, help="Seconds between polls of a caught-up shard."),
    ] = 1.0,
    prefetch_records: Annotated[
        int, typer.Option("--prefetch-records", min=1, help="Per shard, records read ahead.")
    ] = 10_000,
    failover_time: Annotated[
        float,
        typer.Option("--failover-time", min=0.1, help="Lease failover time in seconds (KCL 10)."),
    ] = 10.0,
    take_interval: Annotated[
        float | None,
        typer.Option(
            "--take-interval",
            min=0.01,
            help="Seconds between lease take cycles (default (failover + 0.025) * 2, as KCL).",
            show_default=False,
        ),
    ] = None,
    on_error: Annotated[
        OnError,
        typer.Option(
            "--on-error",
            help="When the handler raises: stop that shard (others go on) or stop the worker.",
        ),
    ] = OnError.STOP_SHARD,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout",
            min=0.0,
            help="On stop, seconds a running handler may take before it is abandoned.",
        ),
    ] = 30.0,
    start_timeout: Annotated[
        float,
        typer.Option(
            "--start-timeout",
            min=0.1,
            help="Seconds the start-up calls (stream and lease-table checks) may keep failing "
            "with errors that pass (throttling, 5xx) before the command gives up.",
        ),
    ] = 300.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus metrics at this port (on --metrics-host), at /metrics.",
            show_default=False,
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            help="The address the metrics port binds: 0.0.0.0 (or ::) for every interface, "
            "so that a scraper outside the container or host reaches it.",
        ),
    ] = "127.0.0.1",
    ordering: OrderingOption = None,
    max_in_flight: MaxInFlight = 256,
    attempts: Attempts = 3,
    on_failure: OnFailureOption = OnFailure.STOP_SHARD,
    bisect_on_error: BisectOption = False,
    max_record_age: MaxRecordAgeOption = None,
    dead_letters: DeadLettersOption = None,
    store_completed: Annotated[
        bool,
        typer.Option(
            "--store-completed",
            help="Store records handled beyond the checkpoint with the lease (a restart skips "
            "them).",
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error.")
    ] = "info",
    endpoint_url: EndpointUrl = None,
    lease_endpoint_url: LeaseEndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
    role_arn: RoleArn = None,
    external_id: ExternalId = None,
    role_session_name: RoleSessionName = None,
) -> None:
    """Consume streams with a handler until SIGTERM or Ctrl-C (graceful: final checkpoints,
    leases released; a second signal stops at once)."""
    handler = load_handler(target)
    level = getattr(logging, log_level.upper(), logging.INFO)
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for sdk in ("botocore", "aiobotocore"):  # their INFO lines (credentials found...) are noise
        logging.getLogger(sdk).setLevel(max(level, logging.WARNING))
    letters_target = dead_letter_target(dead_letters)
    dispatch = dispatch_settings(
        ordering, max_in_flight, attempts, on_failure, dead_letters, bisect_on_error, max_record_age
    )
    if dispatch is not None and batch:
        fail("--batch cannot be combined with dispatch options (--ordering, ...)", code=2)
    try:
        leases = LeaseSettings(failover_time=failover_time, take_interval=take_interval)
        fetch_mode: Polling | FanOut = (
            FanOut(consumer_name=efo_consumer_name)
            if fetch is FetchName.EFO
            else Polling(idle_time=idle_time)
        )
        settings = ConsumerSettings(
            worker_id=worker_id,
            initial_position=parse_start_position(start),
            fetch=fetch_mode,
            leases=leases,
            checkpoint=CheckpointSettings(
                every_n=checkpoint_every,
                interval=checkpoint_interval,
                store_completed=store_completed,
            ),
            deserializer=_DESERIALIZERS[deserializer],
            prefetch_records=prefetch_records,
            on_error="stop-shard" if on_error is OnError.STOP_SHARD else "stop-consumer",
            drain_timeout=drain_timeout,
            start_timeout=start_timeout,
            dispatch=dispatch,
        )
    except ValueError as exc:
        fail(str(exc), code=2)
    role = stream_role(role_arn, external_id, role_session_name)
    aws = aws_settings(endpoint_url, region, profile, role=role, streams=streams)
    lease_aws = aws_settings(lease_endpoint_url or endpoint_url, region, profile)

    async def work() -> None:
        async with (
            _lease_store(
                application, lease_aws, streams, separate=lease_endpoint_url is not None
            ) as store,
            open_dead_letters(letters_target, aws) as letters,
        ):
            consumer = Consumer(streams, application, settings=settings, aws=aws, lease_store=store)
            with _metrics_server(consumer, metrics_host, metrics_port):
                uninstall = install_stop_signals(consumer.request_stop)
                try:
                    await consumer.consume(handler, batch=batch, dead_letters=letters)
                finally:
                    uninstall()

    try:
        run(work())
    except asyncio.CancelledError:
        # Stopped at once (a second signal): do not wait for handlers still running in threads.
        _leave(130)
    if _stuck_handler_threads():
        log.warning("a handler is still running after the stop; exiting without it")
        _leave(0)


def _stuck_handler_threads(grace: float = 1.0) -> bool:
    """Whether a synchronous handler still runs (idle pool threads end within ``grace``)."""
    for thread in threading.enumerate():
        if thread.name.startswith("shardflow-handler"):
            thread.join(grace)
            if thread.is_alive():
                return True
    return False


def _leave(code: int) -> NoReturn:
    """Exit now, even though a thread still runs (Python would wait for it at exit)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.asynccontextmanager
async def _lease_store(
    application: str, aws: AwsSettings, streams: list[str], *, separate: bool
) -> AsyncIterator[LeaseStore | None]:
    """A lease store at a separate DynamoDB endpoint, or None (the consumer opens its own)."""
    if not separate:
        yield None
        return
    async with ClientFactory(aws).dynamodb(own_requests=True) as dynamodb:
        yield DynamoDBLeaseStore(dynamodb, application, streams=streams)


@contextlib.contextmanager
def _metrics_server(consumer: Consumer, host: str, port: int | None) -> Iterator[None]:
    """Prometheus metrics of ``consumer`` served at http://host:port/metrics meanwhile, and its
    health probes at /healthz and /readyz."""
    if port is None:
        yield
        return
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(ConsumerCollector(consumer))
    try:
        server = MetricsServer(host, port, registry, health=consumer.health)
    except OSError as exc:  # a name that does not resolve, an address not here, a port in use
        fail(f"cannot serve metrics on {host} port {port}: {exc.strerror or exc}", code=2)
    bound, bound_port = server.address
    shown = f"[{bound}]" if ":" in bound else bound
    log.info("metrics on http://%s:%d/metrics, probes /healthz and /readyz", shown, bound_port)
    with server:
        yield
