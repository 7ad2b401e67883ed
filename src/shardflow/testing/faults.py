"""A fault-injecting HTTP proxy that puts genuine Kinesis errors between an AWS SDK and an emulator.

No local emulator (moto server, kinesis-local, kinesalite) enforces Kinesis limits, so throttling,
partial PutRecords failures, 5xx answers, timeouts and dropped connections never happen on their
own. Point the SDK at :class:`FaultProxy` instead of the emulator and tell the proxy what to
break::

    with FaultProxy(moto_url, seed=7) as proxy:                  # own thread and event loop
        proxy.add(PartialFailure(fraction=0.3), times=5)         # 30% of entries throttled
        proxy.add(ErrorResponse("InternalFailure"), operation="PutRecords", times=2)
        proxy.add(Delay(2.0), operation="GetRecords", times=1)   # longer than read_timeout
        proxy.add(Drop(after_forwarding=True), operation="PutRecords", times=1)
        ... run the code under test against proxy.url ...
        assert proxy.injected(kind="partial_failure")

``async with FaultProxy(url) as proxy:`` runs it on the caller's event loop instead.

What the proxy guarantees:

- Entries failed by :class:`PartialFailure` are removed from the request before the rest is
  forwarded, so they are really not written; the answer merges the upstream results with the
  synthetic failures at their positions and counts ``FailedRecordCount`` anew. When every entry
  fails nothing is forwarded.
- Error bodies are genuine JSON-protocol errors (``{"__type": ..., "message": ...}``) with the
  status and message text the service uses.
- Everything not hit by a rule passes through unchanged, including other services on the same
  port (DynamoDB on moto) and streamed answers (SubscribeToShard's HTTP/1.1 event stream is
  relayed chunk by chunk).
- Every injected fault is logged (:attr:`FaultProxy.injections`) so that tests can assert that
  the faults really happened. An entry is written when the proxy is done with the request (a
  delay outlives the client's timeout): call ``proxy.wait_idle()`` (sync tests) or
  ``await proxy.idle()`` (async tests) before reading the log. Rules may be added and removed
  while the proxy runs, from any thread.
- Delays and drops before forwarding never reach the emulator, even when the delay ends after
  the client gave up; ``after_forwarding=True`` variants model the ambiguous case instead.

Signatures: the proxy rewrites bodies, so the SigV4 signature of a rewritten request no longer
matches it. moto, kinesalite and kinesis-local do not verify signatures; never put the proxy in
front of real AWS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import threading
import time
from collections import Counter
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, Self

from aiohttp import web

from shardflow.shards import hash_key_of
from shardflow.testing._aws_wire import (
    Context,
    WireResponse,
    error_response,
    failed_entry,
    json_response,
    merge_results,
    without_entries,
)
from shardflow.testing._fault_rules import (
    INTERNAL_FAILURE,
    THROTTLED,
    Decision,
    Delay,
    Drop,
    ErrorResponse,
    Fault,
    FaultKind,
    Injection,
    PartialFailure,
    RequestInfo,
    Rule,
    RuleBook,
    kind_of,
)
from shardflow.testing._upstream import (
    Answer,
    UpstreamClient,
    client_gone,
    hang_up,
    reply_with,
)

__all__ = [
    "INTERNAL_FAILURE",
    "THROTTLED",
    "Delay",
    "Drop",
    "ErrorResponse",
    "Fault",
    "FaultKind",
    "FaultProxy",
    "Injection",
    "PartialFailure",
    "Rule",
]

log = logging.getLogger("shardflow.testing.faults")

_REGION: Final = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")
_MAX_BODY: Final = 64 * 1024 * 1024
_IDLE_POLL: Final = 0.01


class FaultProxy:
    """A local HTTP proxy in front of ``upstream`` that injects faults by rule.

    ``seed`` makes the random choices (probabilities, which entries fail) repeatable; ``account``
    appears in error messages. Use as a context manager (sync: own thread; async: caller's loop).
    """

    def __init__(
        self, upstream: str, *, seed: int | None = None, account: str = "123456789012"
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.account = account
        self._rules = RuleBook(seed)
        self._counts_lock = threading.Lock()
        self._forwarded: Counter[str] = Counter()
        self._forwarded_to: Counter[str] = Counter()
        self._in_flight = 0
        self._latency: tuple[float, float, str | None] | None = None
        self._latency_rng = random.Random(None if seed is None else seed + 1)
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._upstream = UpstreamClient(self.upstream)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None

    # --- rules and records ---------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the endpoint to give the SDK."""
        if self._port is None:
            raise RuntimeError("the fault proxy is not running")
        return f"http://127.0.0.1:{self._port}"

    def add(
        self,
        fault: Fault,
        *,
        operation: str | None = None,
        service: str | None = "Kinesis",
        stream: str | None = None,
        times: int | None = None,
        probability: float = 1.0,
        skip: int = 0,
    ) -> int:
        """Start injecting ``fault`` into matching requests (see :class:`Rule`); returns its id.

        A :class:`PartialFailure` applies to PutRecords whatever ``operation`` says. Rules are
        tried in the order they were added; a request meets at most one fault.
        """
        if isinstance(fault, PartialFailure):
            operation = "PutRecords"
        rule = Rule(fault, operation, service, stream, times, probability, skip)
        return self._rules.add(rule)

    def remove(self, rule_id: int) -> None:
        """Stop applying one rule."""
        self._rules.remove(rule_id)

    def clear(self) -> None:
        """Stop applying every rule; the injection log is kept."""
        self._rules.clear()

    def injected_count(self, rule_id: int) -> int:
        """How often the rule ``rule_id`` has fired."""
        return self._rules.injected_count(rule_id)

    @property
    def injections(self) -> list[Injection]:
        """Every fault injected so far, oldest first."""
        return self._rules.log()

    def injected(
        self, *, kind: FaultKind | None = None, operation: str | None = None
    ) -> list[Injection]:
        """The injections of one kind and/or operation."""
        return [
            i
            for i in self._rules.log()
            if (kind is None or i.kind == kind) and (operation is None or i.operation == operation)
        ]

    def forwarded(self, operation: str) -> int:
        """How many client requests for ``operation`` (fully or partly) reached the upstream."""
        with self._counts_lock:
            return self._forwarded[operation]

    def forwarded_to(self, name: str) -> int:
        """How many client requests naming the stream or table ``name`` reached the upstream."""
        with self._counts_lock:
            return self._forwarded_to[name]

    def set_latency(
        self, low: float, high: float | None = None, *, service: str | None = None
    ) -> None:
        """Hold every request of ``service`` (None: any) for a time drawn uniformly from
        [``low``, ``high``] seconds before forwarding it: the network and service time of the
        real thing, which local emulators answer in well under a millisecond. ``low=0`` with
        no ``high`` turns it off. Not a fault: not logged in :attr:`injections`."""
        top = low if high is None else high
        if low < 0 or top < low:
            raise ValueError(f"latency must satisfy 0 <= low <= high, got {low}, {top}")
        with self._counts_lock:
            self._latency = None if top == 0 else (low, top, service)

    async def _wait_latency(self, service: str) -> None:
        with self._counts_lock:
            latency = self._latency
            if latency is None or (latency[2] is not None and latency[2] != service):
                return
            seconds = self._latency_rng.uniform(latency[0], latency[1])
        await asyncio.sleep(seconds)

    @property
    def in_flight(self) -> int:
        """Requests the proxy is still handling (e.g. delays the client gave up waiting for)."""
        with self._counts_lock:
            return self._in_flight

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Block until no request is in flight, so that the injection log is complete.

        Not from the proxy's own event loop (``async with`` mode): use :meth:`idle` there.
        """
        deadline = time.monotonic() + timeout
        while self.in_flight:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.in_flight} requests still in flight after {timeout}s")
            time.sleep(_IDLE_POLL)

    async def idle(self, limit: float = 10.0) -> None:
        """Wait until no request is in flight, at most ``limit`` seconds (from any event loop).

        Async tests must use this rather than :meth:`wait_idle`: blocking their event loop would
        also keep their clients from closing connections the proxy is waiting on.
        """
        deadline = time.monotonic() + limit
        while self.in_flight:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.in_flight} requests still in flight after {limit}s")
            await asyncio.sleep(_IDLE_POLL)

    # --- life cycle ----------------------------------------------------------------------

    def start(self) -> Self:
        """Serve from a background thread with its own event loop; returns when listening."""
        if self._thread is not None or self._runner is not None:
            raise RuntimeError("the fault proxy is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve_until_stopped(ready, failure)),
            name="shardflow-fault-proxy",
            daemon=True,
        )
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background thread started by :meth:`start`."""
        thread, loop, stop = self._thread, self._loop, self._stop_requested
        if thread is None or loop is None or stop is None:
            return
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        if self._thread is not None or self._runner is not None:
            raise RuntimeError("the fault proxy is already running")
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _serve_until_stopped(
        self, ready: threading.Event, failure: list[BaseException]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        try:
            await self._open()
        except BaseException as exc:
            failure.append(exc)
            ready.set()
            return
        ready.set()
        try:
            await self._stop_requested.wait()
        finally:
            await self._close()

    async def _open(self) -> None:
        await self._upstream.open()
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.25)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        log.debug("fault proxy listening on %s, upstream %s", self.url, self.upstream)

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._upstream.close()
        self._port = None

    # --- serving -------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._counts_lock:
            self._in_flight += 1
        try:
            return await self._inject_or_relay(request)
        finally:
            with self._counts_lock:
                self._in_flight -= 1

    async def _inject_or_relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        service, operation, doc = _describe(request, body)
        stream = _stream_of(doc)
        entries = len(doc.get("Records", [])) if operation == "PutRecords" else 0
        decision = self._rules.choose(RequestInfo(service, operation, stream, entries))
        if decision is None:
            await self._wait_latency(service)
            return await self._relay(request, body, operation, stream)
        # Kind and code only: a fault's message may be anything the test chose.
        code = getattr(decision.fault, "code", "")
        log.debug(
            "injecting %s %s into %s (stream %s)", kind_of(decision.fault), code, operation, stream
        )
        ctx = Context(service, operation, stream, account=self.account, region=_region(request))

        fault = decision.fault
        if isinstance(fault, PartialFailure):
            return await self._partial_failure(request, decision, doc, ctx)
        if isinstance(fault, ErrorResponse):
            answer = (
                await self._forward(request, body, operation) if fault.after_forwarding else None
            )
            self._record(decision, ctx, forwarded=answer is not None)
            if fault.code == THROTTLED and service == "Kinesis":
                ctx = await self._with_shard_of(ctx, request, doc)
            return _reply(
                error_response(fault.code, ctx, status=fault.status, message=fault.message)
            )
        if isinstance(fault, Delay):
            return await self._delay(request, body, decision, ctx)
        upstream = await self._forward(request, body, operation) if fault.after_forwarding else None
        self._record(decision, ctx, forwarded=upstream is not None)
        return hang_up(request, reset=fault.reset)

    async def _partial_failure(
        self, request: web.Request, decision: Decision, doc: dict[str, Any], ctx: Context
    ) -> web.StreamResponse:
        assert isinstance(decision.fault, PartialFailure)
        code = decision.fault.code
        records: list[dict[str, Any]] = doc.get("Records", [])
        failures: dict[int, dict[str, str]] = {}
        for position in decision.failed_entries:
            entry_ctx = ctx
            if code == THROTTLED:
                entry_ctx = await self._with_shard_of(ctx, request, records[position])
            failures[position] = failed_entry(code, entry_ctx)

        upstream_doc: dict[str, Any] | None = None
        # Only a request whose every entry fails stays away from the upstream.
        forwarded = len(failures) < len(records) or not records
        if forwarded:
            rest = json.dumps(without_entries(doc, list(failures)), separators=(",", ":"))
            upstream = await self._forward(request, rest.encode(), ctx.operation)
            if upstream is None:
                self._record(decision, ctx, forwarded=True)
                return hang_up(request)
            status, _, body = upstream
            if status != 200:
                # The rest failed as a whole (stream gone, ...): that is the answer.
                self._record(decision, ctx, forwarded=True)
                return reply_with(upstream)
            upstream_doc = json.loads(body)
        self._record(decision, ctx, forwarded=forwarded)
        try:
            merged = merge_results(upstream_doc, failures, len(records))
        except (ValueError, KeyError) as exc:
            log.warning("cannot merge PutRecords results: %s", exc)
            return _reply(error_response(INTERNAL_FAILURE, ctx))
        return _reply(json_response(merged, service=ctx.service))

    async def _delay(
        self, request: web.Request, body: bytes, decision: Decision, ctx: Context
    ) -> web.StreamResponse:
        assert isinstance(decision.fault, Delay)
        if decision.fault.after_forwarding:
            upstream = await self._forward(request, body, ctx.operation)
            await asyncio.sleep(decision.fault.seconds)
            gone = client_gone(request)
            self._record(decision, ctx, forwarded=upstream is not None, client_gone=gone)
            if upstream is None or gone:
                return hang_up(request)
            return reply_with(upstream)
        await asyncio.sleep(decision.fault.seconds)
        if client_gone(request):
            # The client gave up: like a request lost on the way, it is not forwarded.
            self._record(decision, ctx, forwarded=False, client_gone=True)
            return hang_up(request)
        self._record(decision, ctx, forwarded=True)
        return await self._relay(request, body, ctx.operation, ctx.stream)

    async def _forward(self, request: web.Request, body: bytes, operation: str) -> Answer | None:
        self._count_forwarded(operation)
        return await self._upstream.fetch(request, body)

    async def _relay(
        self, request: web.Request, body: bytes, operation: str, stream: str | None = None
    ) -> web.StreamResponse:
        self._count_forwarded(operation, stream)
        return await self._upstream.relay(request, body)

    def _count_forwarded(self, operation: str, stream: str | None = None) -> None:
        with self._counts_lock:
            self._forwarded[operation] += 1
            if stream is not None:
                self._forwarded_to[stream] += 1

    async def _with_shard_of(
        self, ctx: Context, request: web.Request, entry: dict[str, Any]
    ) -> Context:
        """``ctx`` naming the shard that owns ``entry``'s key (for throttling messages)."""
        if isinstance(entry.get("ShardId"), str):
            return replace(ctx, shard_id=entry["ShardId"])
        key = entry.get("PartitionKey")
        if not isinstance(key, str) or ctx.stream is None:
            return ctx
        shard_map = await self._upstream.shard_map(request, ctx.stream)
        shard = (
            shard_map.shard_for(hash_key_of(key, entry.get("ExplicitHashKey")))
            if shard_map
            else None
        )
        return replace(ctx, shard_id=shard.shard_id) if shard else ctx

    def _record(
        self, decision: Decision, ctx: Context, *, forwarded: bool, client_gone: bool = False
    ) -> None:
        self._rules.record(
            Injection(
                rule_id=decision.rule_id,
                kind=kind_of(decision.fault),
                fault=decision.fault,
                operation=ctx.operation,
                stream=ctx.stream,
                forwarded=forwarded,
                entries=decision.entries,
                failed_entries=decision.failed_entries,
                client_gone=client_gone,
            )
        )


_SERVICE_NAMES: Final = {"GraniteServiceVersion20100801": "CloudWatch"}
"""Services whose requests name them otherwise (``X-Amz-Target`` prefix, or the Smithy RPC v2
path ``/service/NAME/operation/OP``), by the name rules use."""


def _describe(request: web.Request, body: bytes) -> tuple[str, str, dict[str, Any]]:
    """Service, operation and JSON body of an AWS JSON-protocol request (else empty); the
    service and operation of a Smithy RPC v2 request as well."""
    target = request.headers.get("X-Amz-Target", "")
    prefix, _, operation = target.partition(".")
    service = prefix.split("_", 1)[0]
    if not target:
        parts = request.path.strip("/").split("/")
        if len(parts) == 4 and parts[0] == "service" and parts[2] == "operation":
            service, operation = parts[1], parts[3]
    service = _SERVICE_NAMES.get(service, service)
    doc: dict[str, Any] = {}
    if body and "json" in request.headers.get("Content-Type", ""):
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            doc = parsed
    return service, operation, doc


def _stream_of(doc: dict[str, Any]) -> str | None:
    """The stream (or, for DynamoDB, table) a request names; for a DynamoDB batch or
    transaction, the table of its first item."""
    name = doc.get("StreamName") or doc.get("TableName")
    if isinstance(name, str):
        return name
    batch = doc.get("RequestItems")
    if isinstance(batch, dict) and batch:
        return str(next(iter(batch)))
    items = doc.get("TransactItems")
    if isinstance(items, list) and items and isinstance(items[0], dict):
        for operation in items[0].values():
            if isinstance(operation, dict) and isinstance(operation.get("TableName"), str):
                return str(operation["TableName"])
    arn = doc.get("StreamARN")
    return arn.rsplit("/", 1)[-1] if isinstance(arn, str) else None


def _region(request: web.Request) -> str:
    # Only the region is taken from the credential scope; the key id is never looked at.
    found = _REGION.search(request.headers.get("Authorization", ""))
    return found.group(1) if found else "us-east-1"


def _reply(wire: WireResponse) -> web.Response:
    return web.Response(status=wire.status, headers=wire.headers, body=wire.body)
