"""The idempotency guard around dispatched handler calls: skip what was handled, never lose."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from shardflow.backoff import NO_BACKOFF, Backoff
from shardflow.clock import SYSTEM_CLOCK
from shardflow.consumer import ConsumedRecord, Consumer
from shardflow.consumer.delivery import (
    DispatchSettings,
    Idempotency,
    ShardDispatcher,
)
from shardflow.consumer.delivery.calls import RetryingCall
from shardflow.errors import TransientError
from shardflow.idempotency import ClaimOutcome, InMemoryIdempotencyGuard, by_position, by_user_key
from shardflow.leases import InMemoryLeaseStore
from shardflow.records import Record
from shardflow.testing import MemoryKinesis, consume_until_caught_up, fast_settings
from support.dispatch_kit import delivered, is_acked, shard_records
from unit.consumer.test_shard_worker_kit import eventually


def stream_of(count: int) -> MemoryKinesis:
    kinesis = MemoryKinesis()
    kinesis.create_stream("s", 1)
    kinesis.put_many("s", [(f"k{i % 4}", f"{i}".encode()) for i in range(count)])
    return kinesis


def guarded(guard: InMemoryIdempotencyGuard, **options: Any) -> DispatchSettings:
    options.setdefault("retry", replace(NO_BACKOFF, max_attempts=3))
    return DispatchSettings(idempotency=Idempotency(guard), **options)


async def test_a_successor_skips_records_handled_before_and_handles_the_rest() -> None:
    kinesis = stream_of(20)
    guard = InMemoryIdempotencyGuard()
    first: list[bytes] = []
    await consume_until_caught_up(
        "s",
        lambda record: first.append(record.data),
        kinesis=kinesis,
        settings=fast_settings(dispatch=guarded(guard, ordering="key")),
    )
    assert len(first) == 20
    kinesis.put_many("s", [("k9", b"20"), ("k9", b"21")])
    # A fresh lease table: the successor reads the whole shard again, as after a lost checkpoint.
    again: list[bytes] = []
    report = await consume_until_caught_up(
        "s",
        lambda record: again.append(record.data),
        kinesis=kinesis,
        lease_store=InMemoryLeaseStore("test-app"),
        settings=fast_settings(dispatch=guarded(guard, ordering="key")),
    )
    assert again == [b"20", b"21"]
    (shard,) = kinesis.shard_ids("s")
    last = kinesis.records("s", shard)[-1][0]
    assert report.checkpoints[shard].sequence_number == last  # skipped records are acked


async def test_a_failed_call_releases_its_claim_so_the_retry_handles_the_record() -> None:
    kinesis = stream_of(6)
    guard = InMemoryIdempotencyGuard()
    calls: Counter[bytes] = Counter()

    async def flaky(record: ConsumedRecord[bytes]) -> None:
        calls[record.data] += 1
        if record.data == b"3" and calls[record.data] < 3:
            raise ConnectionError("database restarting")

    await consume_until_caught_up(
        "s", flaky, kinesis=kinesis, settings=fast_settings(dispatch=guarded(guard))
    )
    assert calls[b"3"] == 3
    assert all(calls[f"{i}".encode()] == 1 for i in (0, 1, 2, 4, 5))
    (shard,) = kinesis.shard_ids("s")
    # Every record, the flaky one included, is now remembered as done.
    assert len(guard) == 6
    for seq, *_ in kinesis.records("s", shard):
        assert (await guard.claim(f"s/{shard}/{seq}/0")).outcome is ClaimOutcome.DONE


async def test_a_record_claimed_elsewhere_waits_for_the_claim_and_spends_no_attempt() -> None:
    kinesis = stream_of(4)
    guard = InMemoryIdempotencyGuard()
    (shard,) = kinesis.shard_ids("s")
    held_seq = kinesis.records("s", shard)[2][0]
    other = await guard.claim(f"s/{shard}/{held_seq}/0")  # a live claim of another worker
    assert other.claimed
    store = InMemoryLeaseStore("app")
    errors: list[BaseException] = []
    handled: list[bytes] = []
    consumer = Consumer(
        "s",
        "app",
        settings=fast_settings(dispatch=guarded(guard)),
        kinesis=kinesis,
        lease_store=store,
        on_error=lambda stream, shard, error: errors.append(error),
    )
    run = asyncio.create_task(consumer.consume(lambda record: handled.append(record.data)))
    await eventually(lambda: handled == [b"0", b"1"])
    # Far more than the retry policy's attempts would take: the record waits, unhandled,
    # neither failed nor dead-lettered, and the checkpoint stays before it.
    await asyncio.sleep(1.0)
    assert handled == [b"0", b"1"]
    assert not errors
    (lease,) = await store.list_leases()
    assert lease.checkpoint.sequence_number == kinesis.records("s", shard)[1][0]
    # The other worker gives up its claim (it failed, or its claim ran out): handled here.
    await guard.release(other)
    await eventually(lambda: handled == [b"0", b"1", b"2", b"3"])
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert not errors


async def test_user_keys_skip_a_redelivered_event_under_a_new_sequence_number() -> None:
    records = shard_records(["a", "b", "a"])
    guard = InMemoryIdempotencyGuard()
    # The payload's id: the third record repeats the first one's event (a producer retry).
    event_id = by_user_key(lambda r: {b"payload-2": "payload-0"}.get(r.data, r.data.decode()))
    tracker = delivered(records)
    handled: list[bytes] = []
    dispatcher: ShardDispatcher[Any] = ShardDispatcher(
        lambda record: handled.append(record.data),
        tracker,
        DispatchSettings(idempotency=Idempotency(guard, key=event_id)),
    )
    for record in records:
        await dispatcher.submit(record)
    await dispatcher.drain()
    assert handled == [b"payload-0", b"payload-1"]
    assert all(is_acked(tracker, record) for record in records)
    assert (dispatcher.counts.handled, dispatcher.counts.duplicates) == (2, 1)


def test_idempotency_settings_refuse_what_is_not_a_guard() -> None:
    with pytest.raises(TypeError, match="not an idempotency guard"):
        Idempotency(object())  # type: ignore[arg-type]
    assert Idempotency(InMemoryIdempotencyGuard()).key is by_position


async def answers(guard: InMemoryIdempotencyGuard, key: str, outcome: ClaimOutcome) -> None:
    """Wait (bounded) until claiming ``key`` answers ``outcome``; a claim made meanwhile is
    given back."""
    async with asyncio.timeout(5.0):
        while (claim := await guard.claim(key)).outcome is not outcome:
            if claim.claimed:
                await guard.release(claim)
            await asyncio.sleep(0.01)


RECORD = Record(b"x", "pk", "1", shard_id="shard-1", stream_name="s")


def single_call(
    guard: InMemoryIdempotencyGuard,
    handle: Callable[[Record], None] = lambda record: None,
    executor: ThreadPoolExecutor | None = None,
) -> RetryingCall[Record]:
    """One attempt per record, guarded by ``guard``."""
    return RetryingCall(
        handle,
        retry=Backoff(max_attempts=1),
        clock=SYSTEM_CLOCK,
        executor=executor,
        idempotency=Idempotency(guard),
    )


@pytest.mark.parametrize(
    ("fails", "then"), [(False, ClaimOutcome.DONE), (True, ClaimOutcome.CLAIMED)]
)
async def test_a_cancelled_wait_keeps_the_claim_until_the_handler_thread_ends(
    fails: bool, then: ClaimOutcome
) -> None:
    started, go_on = threading.Event(), threading.Event()

    def handle(record: Record) -> None:
        started.set()
        go_on.wait(10.0)
        if fails:
            raise ConnectionError("database gone")

    guard = InMemoryIdempotencyGuard()
    record = RECORD
    with ThreadPoolExecutor(1) as pool:
        running = asyncio.ensure_future(single_call(guard, handle, pool).run(record, lambda: True))
        await asyncio.to_thread(started.wait, 10.0)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        # The handler still runs in its thread: nobody else may claim the record now.
        assert (await guard.claim(by_position(record))).outcome is ClaimOutcome.IN_PROGRESS
        go_on.set()
        # Once the thread has ended its outcome settles the claim, not the TTL (after which the
        # shard's next owner would run a handled record again): completed if the handler
        # returned, released at once if it raised (the next owner runs the record).
        await answers(guard, by_position(record), then)


class _UnmarkableGuard(InMemoryIdempotencyGuard):
    """A guard whose table answers 500 to the first ``failures`` completions."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def complete(self, claim: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise TransientError("InternalServerError", operation="PutItem", code="500")
        await super().complete(claim)


async def test_a_completion_refused_by_a_brownout_is_retried_until_it_lands() -> None:
    guard = _UnmarkableGuard(failures=3)
    record = RECORD
    attempts = await single_call(guard).run(record, lambda: True)
    assert attempts.succeeded  # handled: acknowledged at once, the mark follows
    await answers(guard, by_position(record), ClaimOutcome.DONE)
    assert guard.failures == 0


class _Letters:
    def __init__(self) -> None:
        self.records: list[bytes] = []

    async def dead_letter(self, record: Any, error: BaseException, attempts: int) -> None:
        self.records.append(record.data)


class _BrownedOutGuard(InMemoryIdempotencyGuard):
    """A guard whose table answers 500 to every claim until ``heal()``."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_claims = 0
        self._healed = False

    def heal(self) -> None:
        self._healed = True

    async def claim(self, key: str) -> Any:
        if not self._healed:
            self.failed_claims += 1
            raise TransientError("InternalServerError", operation="PutItem", code="500")
        return await super().claim(key)


async def test_a_guard_brownout_spends_no_attempt_and_dead_letters_nothing() -> None:
    """A DynamoDB brownout of the idempotency table is not the record's failure: records wait
    (many times the retry policy's attempts) and are handled when the table answers again."""
    kinesis = stream_of(4)
    guard = _BrownedOutGuard()
    store = InMemoryLeaseStore("app")
    errors: list[BaseException] = []
    handled: list[bytes] = []
    letters = _Letters()
    consumer = Consumer(
        "s",
        "app",
        settings=fast_settings(dispatch=guarded(guard, on_failure="skip")),
        kinesis=kinesis,
        lease_store=store,
        on_error=lambda stream, shard, error: errors.append(error),
    )
    run = asyncio.create_task(
        consumer.consume(lambda record: handled.append(record.data), dead_letters=letters)
    )
    await eventually(lambda: guard.failed_claims > 10)
    await asyncio.sleep(0.3)
    assert handled == []
    assert letters.records == []
    guard.heal()
    await eventually(lambda: sorted(handled) == [b"0", b"1", b"2", b"3"])
    await consumer.close()
    await asyncio.wait_for(run, 5)
    assert not errors
    assert letters.records == []


class _SlowClaimGuard(InMemoryIdempotencyGuard):
    """A guard whose claims wait for ``answer`` (a table slow to answer, a frozen process)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def claim(self, key: str) -> Any:
        self.asked.set()
        await self.answer.wait()
        return await super().claim(key)


async def test_a_record_whose_lease_lapsed_during_its_claim_is_not_run() -> None:
    """The lease is checked right before the handler call, not only when the record was
    accepted: a worker frozen (SIGSTOP) while asking the guard wakes up past its lease's
    deadline, and must not run the record while the shard's next owner may be running it."""
    guard = _SlowClaimGuard()
    records = shard_records(["a"])
    tracker = delivered(records)
    held = True
    calls: list[bytes] = []
    dispatcher: ShardDispatcher[Record] = ShardDispatcher(
        lambda record: calls.append(record.data),
        tracker,
        guarded(guard),
        lease_held=lambda: held,
    )
    await dispatcher.submit(records[0])
    await asyncio.wait_for(guard.asked.wait(), 5)
    held = False  # the lease lapsed while the claim was on its way
    guard.answer.set()
    await asyncio.wait_for(dispatcher.drain(), 5)
    assert calls == []
    assert not is_acked(tracker, records[0])
    assert dispatcher.counts.abandoned == 1
    # The claim was given back: the next owner handles the record without waiting for a TTL.
    assert (await guard.claim(by_position(records[0]))).claimed


class _HangingCompletionGuard(InMemoryIdempotencyGuard):
    """A guard whose first completion hangs (a table retrying 5xx answers) until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.completing = asyncio.Event()
        self.hung = False

    async def complete(self, claim: Any) -> None:
        if not self.hung:
            self.hung = True
            self.completing.set()
            await asyncio.Event().wait()
        await super().complete(claim)


async def test_a_completion_whose_wait_is_cancelled_still_lands() -> None:
    """The lease is lost while the handled record's completion is on its way: the record is
    not acknowledged here, but its mark must still land, or the next owner runs it again."""
    guard = _HangingCompletionGuard()
    record = RECORD
    running = asyncio.ensure_future(single_call(guard).run(record, lambda: True))
    await asyncio.wait_for(guard.completing.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await answers(guard, by_position(record), ClaimOutcome.DONE)
