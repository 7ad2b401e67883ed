"""Lease pick-up sources on moto's server over HTTP: the lease table's DynamoDB stream and the
polling fallback, as the coordinator reads them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from shardflow.clock import SYSTEM_CLOCK
from shardflow.leases import Lease
from shardflow.leases.entities import MODE_KEY
from shardflow.leases.pickup import LeaseView, PollingChanges, StreamChanges
from support.lease_backends import DynamoBackend

WITHIN = 5.0


async def next_view(views: AsyncIterator[LeaseView], want: str) -> LeaseView:
    """The first view showing lease ``want`` (within WITHIN seconds)."""
    async with asyncio.timeout(WITHIN):
        async for view in views:
            if any(lease.lease_key == want for lease in view.leases) or want in view.removed:
                return view
    raise AssertionError("the views ended")


async def test_the_stream_shows_every_write_as_the_item_after_it(moto_url: str) -> None:
    async with DynamoBackend(moto_url) as backend, contextlib.AsyncExitStack() as stack:
        store = await backend.store()
        table = await store.ensure_table(stream_view=True)
        assert table.stream_arn is not None
        assert table.stream_arn.startswith("arn:")
        streams = await stack.enter_async_context(backend.factory.dynamodbstreams())
        changes = StreamChanges(streams, table.stream_arn, interval=0.05, clock=SYSTEM_CLOCK)
        views = changes.views()
        before = await store.create_if_absent(Lease.new("shardId-1"))  # before reading: unseen
        first = asyncio.ensure_future(next_view(views, "shardId-2"))
        await asyncio.sleep(0.3)  # the reader has its iterators (LATEST) now
        created = await store.create_if_absent(Lease.new("shardId-2"))
        view = await first
        assert not view.complete
        assert [lease.lease_key for lease in view.leases] == ["shardId-2"]
        assert view.leases[0] == created

        started = asyncio.get_running_loop().time()
        taken = await store.take(created, "worker-b")
        view = await next_view(views, "shardId-2")
        assert asyncio.get_running_loop().time() - started < 1.0, "within a few hundred ms"
        assert view.leases[0].lease_owner == "worker-b"
        assert view.leases[0].lease_counter == taken.lease_counter

        await store.delete(taken)
        view = await next_view(views, "shardId-2")
        assert view.removed == ("shardId-2",)
        assert before.lease_key not in {lease.lease_key for lease in view.leases}
        await views.aclose()  # type: ignore[attr-defined]


async def test_polling_yields_the_whole_table_every_interval(moto_url: str) -> None:
    async with DynamoBackend(moto_url) as backend:
        store = await backend.store()
        await store.ensure_table()
        await store.create_if_absent(Lease.new("shardId-1"))
        views = PollingChanges(store, interval=0.05, clock=SYSTEM_CLOCK).views()
        view = await next_view(views, "shardId-1")
        assert view.complete
        await store.create_if_absent(Lease.new("shardId-2"))
        view = await next_view(views, "shardId-2")
        assert sorted(lease.lease_key for lease in view.leases) == ["shardId-1", "shardId-2"]
        await views.aclose()  # type: ignore[attr-defined]


async def test_auto_gives_a_table_it_creates_a_stream_and_leaves_an_existing_one_alone(
    moto_url: str,
) -> None:
    async with DynamoBackend(moto_url) as new, DynamoBackend(moto_url) as existing:
        created = await (await new.store()).ensure_table(stream_if_created=True)
        assert created.created
        assert created.stream_arn is not None

        plain = await (await existing.store()).ensure_table()
        assert plain.stream_arn is None
        again = await (await existing.store()).ensure_table(stream_if_created=True)
        assert not again.created
        assert again.stream_arn is None, "an existing table (a KCL application's) is not changed"


async def test_polling_a_heartbeat_table_reads_its_marks_and_scans_when_a_lease_moves(
    moto_url: str,
) -> None:
    async with DynamoBackend(moto_url) as backend:
        writer, reader = await backend.store(), await backend.store()
        await writer.ensure_table()
        await writer.register_heartbeat("a", None)
        lease = await writer.take(await writer.create_if_absent(Lease.new("shardId-1")), "a")
        await writer.set_lease_mode("heartbeat")
        changes = PollingChanges(reader, interval=0.05, clock=SYSTEM_CLOCK, full_every=60.0)
        views = changes.views()
        async with asyncio.timeout(WITHIN):
            # A scan, then a scan after the marks were read once (the marker's base), then
            # the marks alone while nothing moves.
            seen = [await anext(views) for _ in range(6)]
        assert [view.complete for view in seen] == [True, True, False, False, False, False]
        assert changes.scans == 2
        assert all(view.heartbeats[0].worker_id == "a" for view in seen[2:])
        released = await writer.release(lease, "a")  # bumps the marker: the next poll scans
        view = await next_view(views, "shardId-1")
        assert view.complete
        assert view.leases == (released,)
        await views.aclose()  # type: ignore[attr-defined]


async def test_a_table_with_a_stream_gets_no_bumps(
    moto_url: str,
) -> None:
    async with DynamoBackend(moto_url) as backend:
        writer = await backend.store()
        table = await writer.ensure_table(stream_view=True)  # its readers use the stream
        assert table.stream_arn is not None
        await writer.set_lease_mode("heartbeat")
        before = backend.get_raw(MODE_KEY)
        await writer.take(await writer.create_if_absent(Lease.new("shardId-1")), "a")
        await writer.settle_marks()
        assert backend.get_raw(MODE_KEY) == before, "a bump would be a write for nobody"
