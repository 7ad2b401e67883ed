"""Lease pick-up by polling, on the in-memory table: on a heartbeat-mode table it reads the
change marker and the heartbeats between scans, and scans whenever either says the table may
have changed, or ``full_every`` passed; any other table it scans every interval."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shardflow.clock import ManualClock
from shardflow.errors import AccessDeniedError, ThrottledError
from shardflow.leases import InMemoryLeaseStore, InMemoryLeaseTables, Lease
from shardflow.leases.entities import Heartbeat, heartbeat_item
from shardflow.leases.memory import InMemoryLeaseStreams
from shardflow.leases.model import lease_to_item
from shardflow.leases.pickup import (
    THROTTLED_PAUSE_MAX,
    LeaseView,
    PollingChanges,
    StreamChanges,
)

INTERVAL = 0.25
FULL_EVERY = 3.0


class Poller:
    """One poller of the table ``tables`` holds, with its calls counted by operation."""

    def __init__(
        self,
        tables: InMemoryLeaseTables,
        *,
        full_every: float | None = FULL_EVERY,
        refused: frozenset[str] = frozenset(),
    ) -> None:
        self.refused = refused
        self.clock = ManualClock()
        self.calls: Counter[str] = Counter()
        self.store = InMemoryLeaseStore("app", tables=tables, fault=self._count)
        self.changes = PollingChanges(
            self.store, interval=INTERVAL, clock=self.clock, full_every=full_every
        )
        self._views: AsyncIterator[LeaseView] = self.changes.views()

    def _count(self, operation: str) -> None:
        self.calls[operation] += 1
        if operation in self.refused:
            raise AccessDeniedError("not allowed", operation=operation, code="AccessDenied")

    async def next(self) -> LeaseView:
        """The next view (the first at once, later ones an interval apart)."""
        task = asyncio.ensure_future(anext(self._views))
        for _ in range(10):
            await asyncio.sleep(0)
        if not task.done():
            await self.clock.advance(INTERVAL)
        return await task

    async def polls(self, n: int) -> list[LeaseView]:
        return [await self.next() for _ in range(n)]


async def heartbeat_table(
    workers: int = 2, leases: int = 10
) -> tuple[InMemoryLeaseTables, InMemoryLeaseStore, list[Heartbeat]]:
    """A heartbeat-mode table whose leases all belong to workers that keep heartbeats."""
    tables = InMemoryLeaseTables()
    writer = InMemoryLeaseStore("app", tables=tables, create_table=True)
    beats = [await writer.register_heartbeat(f"w{i}", None) for i in range(workers)]
    for i in range(leases):
        lease = await writer.create_if_absent(Lease.new(f"shardId-{i:03d}"))
        await writer.take(lease, f"w{i % workers}")
    await writer.set_lease_mode("heartbeat")
    return tables, writer, beats


async def test_an_unchanged_heartbeat_table_is_scanned_once_per_full_interval() -> None:
    tables, _, _ = await heartbeat_table()
    poller = Poller(tables)
    views = await poller.polls(2)  # a first scan, then one after a marker read (its base)
    assert all(view.complete for view in views)
    poller.calls.clear()
    views = await poller.polls(round(2 * FULL_EVERY / INTERVAL))
    # Two safety-net scans in 6 s; every other poll read only the marks.
    assert poller.calls["Scan"] == 2, poller.calls
    assert poller.calls["BatchGetItem"] == len(views), poller.calls
    partial = [view for view in views if not view.complete]
    assert len(partial) == len(views) - 2
    # Each partial view shows every heartbeat: peers judge expiry by them.
    assert all(len(view.heartbeats) == 2 for view in partial)
    assert all(view.mode == "heartbeat" and view.mode_seen for view in partial)


async def test_a_noticed_write_is_seen_by_the_next_poll() -> None:
    tables, writer, _ = await heartbeat_table()
    poller = Poller(tables)
    await poller.polls(3)
    lease = next(lease for lease in await writer.list_leases() if lease.lease_owner == "w0")
    released = await writer.release(lease, "w0")
    view = await poller.next()
    assert view.complete, "the marker moved: the next poll scans"
    assert released in view.leases
    assert not (await poller.next()).complete, "and then reads only the marks again"


async def test_a_write_that_bumped_nothing_is_seen_at_the_next_full_scan() -> None:
    tables, writer, _ = await heartbeat_table()
    poller = Poller(tables)
    await poller.polls(3)
    # A writer that does not bump the marker (a crash between its write and the bump).
    lease = next(iter(await writer.list_leases()))
    tables.put_raw("app", lease_to_item(Lease(lease.lease_key, lease_counter=99)))
    seen_after = None
    for n in range(1, round(FULL_EVERY / INTERVAL) + 2):
        view = await poller.next()
        if view.complete and any(lease.lease_counter == 99 for lease in view.leases):
            seen_after = n * INTERVAL
            break
    assert seen_after is not None
    assert seen_after <= FULL_EVERY + INTERVAL


async def test_a_heartbeat_that_came_went_or_was_fenced_makes_the_poll_scan() -> None:
    tables, _, beats = await heartbeat_table()
    poller = Poller(tables)
    await poller.polls(3)
    # Written raw, without a bump: the heartbeats read with the marker show it anyway.
    tables.put_raw("app", heartbeat_item(Heartbeat("w0", beats[0].counter, fenced_by="w1")))
    assert (await poller.next()).complete
    assert not (await poller.next()).complete
    tables.tables["app"].remove(beats[1].key)
    assert (await poller.next()).complete


async def test_a_beat_is_shown_without_a_scan() -> None:
    tables, writer, beats = await heartbeat_table()
    poller = Poller(tables)
    await poller.polls(3)
    beaten = await writer.beat(beats[0])
    view = await poller.next()
    assert not view.complete
    assert beaten in view.heartbeats


async def test_a_lease_kept_without_a_heartbeat_makes_every_poll_scan() -> None:
    tables, writer, _ = await heartbeat_table()
    lease = await writer.create_if_absent(Lease.new("shardId-999"))
    await writer.take(lease, "older-version")  # renews lease by lease: scans must see it
    poller = Poller(tables)
    views = await poller.polls(8)
    assert all(view.complete for view in views)
    assert poller.calls["BatchGetItem"] == 0


async def test_a_per_lease_table_is_scanned_every_poll_and_its_marks_never_read() -> None:
    tables = InMemoryLeaseTables()
    writer = InMemoryLeaseStore("app", tables=tables, create_table=True)
    await writer.take(await writer.create_if_absent(Lease.new("shardId-1")), "a")
    poller = Poller(tables)
    views = await poller.polls(8)
    assert all(view.complete for view in views)
    assert poller.calls == Counter({"Scan": 8})


async def test_without_full_every_every_poll_scans() -> None:
    tables, _, _ = await heartbeat_table()
    poller = Poller(tables, full_every=None)
    views = await poller.polls(6)
    assert all(view.complete for view in views)
    assert poller.calls == Counter({"Scan": 6})


async def test_a_policy_without_batch_get_falls_back_to_a_scan_every_poll() -> None:
    tables, _, _ = await heartbeat_table()
    poller = Poller(tables, refused=frozenset({"BatchGetItem"}))
    views = await poller.polls(8)
    assert all(view.complete for view in views)
    assert poller.calls == Counter({"Scan": 8, "BatchGetItem": 1}), "asked once"


async def scans_in(tables: InMemoryLeaseTables, seconds: float) -> int:
    """Scans one poller makes of the table in ``seconds`` of its clock."""
    poller = Poller(tables)
    seen: list[LeaseView] = []

    async def read() -> None:
        async for view in poller.changes.views():
            seen.append(view)

    task = asyncio.create_task(read())
    try:
        for _ in range(round(seconds / 0.05)):
            await poller.clock.advance(0.05)
            for _ in range(5):
                await asyncio.sleep(0)
    finally:
        task.cancel()
    assert all(view.complete for view in seen)
    return poller.calls["Scan"]


async def test_a_large_table_is_scanned_at_most_scan_rate_leases_a_second() -> None:
    # Every scan reads every item, changed or not: 1,000 leases scanned four times a second
    # were a quarter of an idle per-lease consumer's CPU. Up to 250 leases: every interval.
    small, large = InMemoryLeaseTables(), InMemoryLeaseTables()
    for tables, count in ((small, 100), (large, 1000)):
        writer = InMemoryLeaseStore("app", tables=tables, create_table=True)
        for i in range(count):
            await writer.take(await writer.create_if_absent(Lease.new(f"shardId-{i:04d}")), "a")
    assert await scans_in(small, 5.0) >= 19  # every 0.25 s
    assert 5 <= await scans_in(large, 5.0) <= 6  # every 1 s: 1,000 leases a second


async def test_a_stream_read_keeps_renewals_apart_and_any_other_change_of_the_same_lease_whole() -> (
    None
):
    # Renewals take a path of their own through a stream read (the commonest record by far);
    # a lease changed otherwise in the same read, before or after its renewal, must still
    # come out among the changed leases, as its latest image.
    tables = InMemoryLeaseTables()
    store = InMemoryLeaseStore("app", tables=tables)
    status = await store.ensure_table(stream_view=True)
    assert status.stream_arn is not None
    leases: dict[str, Lease] = {}
    for key in ("only-renewed", "taken-then-renewed", "renewed-then-released"):
        created = await store.create_if_absent(Lease(lease_key=key))
        leases[key] = await store.take(created, "a")
    clock = ManualClock()
    changes = StreamChanges(
        InMemoryLeaseStreams(tables), status.stream_arn, interval=INTERVAL, clock=clock
    )
    views = changes.views()
    first = await anext(views)
    assert first.resumed
    renewed = await store.renew(leases["only-renewed"], "a")
    taken = await store.take(leases["taken-then-renewed"], "b")
    taken = await store.renew(taken, "b")
    before = await store.renew(leases["renewed-then-released"], "a")
    released = await store.release(before, "a")
    task = asyncio.ensure_future(anext(views))
    for _ in range(10):
        await asyncio.sleep(0)
    if not task.done():
        await clock.advance(INTERVAL)
    view = await task
    assert [lease.lease_key for lease in view.renewed] == ["only-renewed"]
    assert view.renewed[0].lease_counter == renewed.lease_counter
    changed = {lease.lease_key: lease for lease in view.leases}
    assert set(changed) == {"taken-then-renewed", "renewed-then-released"}
    assert changed["taken-then-renewed"].lease_counter == taken.lease_counter
    assert changed["taken-then-renewed"].lease_owner == "b"
    assert changed["renewed-then-released"].lease_owner is None
    assert released.lease_owner is None


async def streamed_table() -> tuple[InMemoryLeaseTables, InMemoryLeaseStore, str, Lease]:
    """A lease table with its stream on, and one free lease in it."""
    tables = InMemoryLeaseTables()
    store = InMemoryLeaseStore("app", tables=tables)
    status = await store.ensure_table(stream_view=True)
    assert status.stream_arn is not None
    created = await store.create_if_absent(Lease(lease_key="shardId-1"))
    return tables, store, status.stream_arn, created


class TwoShardStream:
    """The table's stream as :class:`InMemoryLeaseStreams` shows it, with a second stream
    shard listed after it whose reads fail while ``failing`` is set (a stream whose later
    shard answers errors for a while)."""

    def __init__(self, tables: InMemoryLeaseTables) -> None:
        self._real = InMemoryLeaseStreams(tables)
        self.failing = True

    async def describe_stream(self, **params: Any) -> dict[str, Any]:
        answer = await self._real.describe_stream(**params)
        shards = answer["StreamDescription"]["Shards"]
        shards.append(
            {"ShardId": "shard-later", "SequenceNumberRange": {"StartingSequenceNumber": "9"}}
        )
        return answer

    async def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        if params["ShardId"] == "shard-later":
            return {"ShardIterator": "later"}
        return await self._real.get_shard_iterator(**params)

    async def get_records(self, **params: Any) -> dict[str, Any]:
        if params["ShardIterator"] == "later":
            if self.failing:
                raise AccessDeniedError("not allowed", operation="GetRecords", code="AccessDenied")
            return {"Records": [], "NextShardIterator": "later"}
        return await self._real.get_records(**params)


async def test_a_failed_read_of_a_later_stream_shard_keeps_what_the_earlier_shards_showed() -> None:
    # The earlier shard's iterator has moved past its records when a later shard's read fails:
    # a view thrown away with the error would lose those changes for good.
    tables, store, stream_arn, created = await streamed_table()
    clock = ManualClock()
    stream = TwoShardStream(tables)
    views = StreamChanges(stream, stream_arn, interval=INTERVAL, clock=clock).views()
    assert (await anext(views)).resumed

    async def next_view() -> LeaseView:
        task = asyncio.ensure_future(anext(views))
        for _ in range(3):
            for _ in range(10):
                await asyncio.sleep(0)
            if task.done():
                break
            await clock.advance(INTERVAL)
        if not task.done():
            task.cancel()
            raise AssertionError("no view came in three intervals")
        return task.result()

    taken = await store.take(created, "a")
    view = await next_view()
    assert [lease.lease_counter for lease in view.leases] == [taken.lease_counter]
    stream.failing = False
    released = await store.release(taken, "a")
    view = await next_view()
    assert [lease.lease_owner for lease in view.leases] == [released.lease_owner]


async def test_a_throttled_stream_is_read_less_and_less_often_then_as_before() -> None:
    # DynamoDB Streams throttles a stream shard read by more than about two processes, and
    # every worker of a fleet reads every shard of its lease table's stream: each throttled
    # worker kept reading four times a second (and retrying each read), logging every time.
    tables, store, stream_arn, created = await streamed_table()
    throttled = {"on": False}
    reads: list[float] = []
    clock = ManualClock()

    def fault(operation: str) -> None:
        if operation == "GetRecords":
            reads.append(clock.monotonic())
            if throttled["on"]:
                raise ThrottledError(
                    "rate exceeded", operation=operation, code="LimitExceededException"
                )

    changes = StreamChanges(
        InMemoryLeaseStreams(tables, fault=fault), stream_arn, interval=INTERVAL, clock=clock
    )
    seen: list[LeaseView] = []

    async def read() -> None:
        async for view in changes.views():
            seen.append(view)

    async def run(seconds: float) -> None:
        for _ in range(round(seconds / 0.05)):
            await clock.advance(0.05)
            for _ in range(5):
                await asyncio.sleep(0)

    reader = asyncio.ensure_future(read())
    try:
        await run(2.0)
        throttled["on"] = True
        began, before = clock.monotonic(), len(reads)
        await run(30.0)
        calls = len(reads) - before
        # Unthrottled: 4 reads a second, each tried up to 3 times: 360 calls in 30 s.
        assert calls <= 45, calls
        assert changes.pause == pytest.approx(THROTTLED_PAUSE_MAX)
        assert changes.throttled_reads >= 5
        assert reads[-1] >= began + 20, "still read now and then"
        throttled["on"] = False
        await run(15.0)
        assert changes.pause == pytest.approx(INTERVAL), "back to the interval"
        taken = await store.take(created, "a")
        await run(1.0)
        assert any(
            lease.lease_counter == taken.lease_counter for view in seen for lease in view.leases
        ), "the change is picked up within an interval again"
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
