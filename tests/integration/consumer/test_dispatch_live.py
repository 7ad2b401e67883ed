"""Dispatch properties end to end on moto's server (Kinesis and DynamoDB over HTTP).

Hypothesis draws the keys, KPL aggregation, handler latencies and failures; each example writes
a fresh one-shard stream with boto3 and runs the real consumer (dead letters to a JSON-lines
file, leases in DynamoDB) on a fresh event loop:

- per-key order holds (key mode), nothing is lost (every record handled or dead-lettered), and
  no checkpoint write ever names a position with an unfinished record at or before it (checked
  by the lease store at the moment it sends the write);
- a worker killed with records in flight (its task cancelled: no final checkpoint) leaves its
  completed-beyond-the-checkpoint records in the lease, and its successor handles exactly the
  records the first did not finish: no more, no fewer, once each.

Examples are few and derandomized (the suite's time budget); lease timing is short.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from shardflow.aggregation import aggregate
from shardflow.aws import AwsSettings, ClientFactory
from shardflow.backoff import Backoff
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.delivery import (
    DispatchSettings,
    FailurePolicy,
    Idempotency,
    OrderingMode,
)
from shardflow.deadletter import DeadLetter, JsonLinesDestination
from shardflow.fetch import Polling
from shardflow.leases import Lease
from shardflow.leases.dynamodb import DynamoDBLeaseStore
from shardflow.leases.settings import LeaseSettings
from shardflow.read.completed import decode_completed
from shardflow.records import ExtendedSequenceNumber, Record
from support.boto import lease_items, make_stream, put_records, user_records
from support.waiting import until

BASE = ConsumerSettings(
    leases=LeaseSettings(
        failover_time=2.0, renew_interval=0.4, take_interval=0.5, safety_margin=0.3
    ),
    fetch=Polling(idle_time=0.05),
    checkpoint=CheckpointSettings(every_n=4, interval=0.1, store_completed=True),
    drain_timeout=1.0,
)
QUICK_RETRY = Backoff(base=0.002, cap=0.01, max_attempts=2, jitter="half")
EXAMPLES = settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    # No shrinking: a failing example is reported as drawn, within the suite's time budget.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the stream ------------------------------------------------------------------------------


def write_stream(url: str, keys: Sequence[str], aggregate_every: int) -> tuple[str, list[Record]]:
    """A new one-shard stream holding one user record per key (data = its index), optionally
    packed ``aggregate_every`` to a KPL aggregate; returns its name and its user records."""
    stream = f"dispatch-{uuid.uuid4().hex[:10]}"
    kinesis = make_stream(url, stream, 1)
    items = [(key, str(i).encode()) for i, key in enumerate(keys)]
    if aggregate_every > 1:
        packed = [
            aggregate([(k, d, None) for k, d in items[i : i + aggregate_every]])[0]
            for i in range(0, len(items), aggregate_every)
        ]
        items = [(built.partition_key, built.data) for built in packed]
    put_records(kinesis, stream, items)
    records = user_records(url, stream)
    assert [int(r.data) for r in records] == list(range(len(keys)))
    return stream, records


def stored_progress(url: str, table: str) -> set[ExtendedSequenceNumber] | None:
    """What the lease says is done: the checkpoint, and the completed records stored beyond it
    (as a set of positions after the checkpoint plus the checkpoint itself); None: no lease."""
    items = list(lease_items(url, table).values())
    if not items:
        return None
    (item,) = items
    checkpoint = ExtendedSequenceNumber(
        item["checkpoint"]["S"], int(item.get("checkpointSubSequenceNumber", {"N": "0"})["N"])
    )
    done = {checkpoint}
    if "shardflowCompleted" in item:
        state = decode_completed(item["shardflowCompleted"]["B"])
        assert state.base == checkpoint
        done |= set(state.completed)
    return done


def finished_by(done: set[ExtendedSequenceNumber], records: Sequence[Record]) -> set[int]:
    """Indexes of the records a stored progress covers."""
    checkpoint = min(done)
    return {
        int(r.data)
        for r in records
        if not checkpoint.is_sentinel and (r.position <= checkpoint or r.position in done)
    }


# --- watching the consumer -------------------------------------------------------------------


@dataclass
class Watch:
    """Everything the handler, the dead letters and the lease store saw, and broken rules."""

    records: list[Record]
    finished: set[int] = field(default_factory=set)
    letters: list[int] = field(default_factory=list)
    calls: Counter[int] = field(default_factory=Counter)
    starts_per_key: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    running_per_key: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def check_checkpoint(self, position: ExtendedSequenceNumber) -> None:
        if position.is_sentinel:
            return
        unfinished = [
            int(r.data)
            for r in self.records
            if r.position <= position and int(r.data) not in self.finished
        ]
        if unfinished:
            self.violations.append(f"checkpoint {position} passes unfinished {unfinished}")


class WatchedLeaseStore(DynamoDBLeaseStore):
    """The DynamoDB store, checking every checkpoint against what is finished as it is sent."""

    watch: Watch

    async def checkpoint(
        self, lease: Lease, owner: str, position: ExtendedSequenceNumber, **options: Any
    ) -> Lease:
        self.watch.check_checkpoint(position)
        return await super().checkpoint(lease, owner, position, **options)

    async def release(self, lease: Lease, owner: str, **options: Any) -> Lease:
        # A handoff's last checkpoint travels with the release.
        final = options.get("final_checkpoint")
        if final is not None:
            self.watch.check_checkpoint(final)
        return await super().release(lease, owner, **options)


class WatchedLetters(JsonLinesDestination):
    """A JSON-lines file that notes each letter once it is stored."""

    watch: Watch

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        await super().write(letters)
        for letter in letters:
            self.watch.letters.append(int(letter.data))
            self.watch.finished.add(int(letter.data))


# --- property 1: order, nothing lost, safe checkpoints ----------------------------------------


@dataclass(frozen=True)
class Scenario:
    keys: list[str]
    aggregate_every: int
    latencies_ms: list[int]
    failing_calls: list[int]
    ordering: OrderingMode
    policy: FailurePolicy


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(12, 40))
    pool = draw(st.sampled_from([list("ab"), list("abcde"), [f"k{i}" for i in range(12)]]))
    return Scenario(
        keys=draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count)),
        aggregate_every=draw(st.sampled_from([0, 3])),
        latencies_ms=draw(st.lists(st.integers(0, 8), min_size=count, max_size=count)),
        # Mostly fine; some records recover on retry (1), some fail for good (2 = attempts).
        failing_calls=draw(
            st.lists(st.sampled_from([0, 0, 0, 0, 1, 2]), min_size=count, max_size=count)
        ),
        ordering=draw(st.sampled_from(["key", "key", "unordered"])),
        policy=draw(st.sampled_from(["skip", "block-key"])),
    )


async def run_scenario(url: str, scenario: Scenario, letters_path: Path) -> None:
    stream, records = write_stream(url, scenario.keys, scenario.aggregate_every)
    app = f"{stream}-app"
    watch = Watch(records)

    async def handle(record: ConsumedRecord[bytes]) -> None:
        index = int(record.data)
        key = record.partition_key
        watch.calls[index] += 1
        if watch.calls[index] == 1:
            watch.starts_per_key[key].append(index)
        watch.running_per_key[key] += 1
        if scenario.ordering == "key" and watch.running_per_key[key] > 1:
            watch.violations.append(f"two records of key {key} at once")
        try:
            await asyncio.sleep(scenario.latencies_ms[index] / 1000)
            if watch.calls[index] <= scenario.failing_calls[index]:
                raise ValueError(f"record {index} fails call {watch.calls[index]}")
            watch.finished.add(index)
        finally:
            watch.running_per_key[key] -= 1

    dispatch = DispatchSettings(
        ordering=scenario.ordering,
        max_in_flight_per_shard=8,
        retry=QUICK_RETRY,
        on_failure=scenario.policy,
    )
    letters = WatchedLetters(letters_path)
    letters.watch = watch
    async with ClientFactory(AwsSettings(endpoint_url=url)).dynamodb() as dynamodb:
        store = WatchedLeaseStore(dynamodb, app)
        store.watch = watch
        consumer = Consumer(
            stream,
            app,
            settings=replace(BASE, dispatch=dispatch),
            aws=AwsSettings(endpoint_url=url),
            lease_store=store,
        )
        run = asyncio.create_task(consumer.consume(handle, dead_letters=letters))
        try:
            await until(lambda: len(watch.finished) == len(records) or run.done(), 30)
        finally:
            await consumer.close()
            await run
    await letters.close()

    assert watch.violations == []
    # Nothing lost: every record handled or dead-lettered, each exactly once.
    assert watch.finished == set(range(len(records)))
    assert sorted(watch.letters) == sorted(set(watch.letters))
    for index in watch.letters:
        # A letter only for a record that failed for good, or whose key was blocked before it.
        assert scenario.failing_calls[index] >= 2 or (
            scenario.policy == "block-key" and watch.calls[index] == 0
        )
    if scenario.ordering == "key":
        for key, starts in watch.starts_per_key.items():
            assert starts == sorted(starts), key
    # The final checkpoint covers the last record (sub-record of an aggregate included).
    assert stored_progress(url, app) == {records[-1].position}


@EXAMPLES
@given(scenario=scenarios())
def test_key_order_nothing_lost_and_no_checkpoint_passes_an_unfinished_record(
    moto_url: str, scenario: Scenario
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run_scenario(moto_url, scenario, Path(directory) / "letters.jsonl"))


# --- property 2: a killed worker's successor handles only the incomplete window --------------


@dataclass(frozen=True)
class Kill:
    keys: list[str]
    aggregate_every: int
    latencies_ms: list[int]
    stuck: frozenset[int]
    """Records whose handler never returns in the first worker."""


@st.composite
def kills(draw: st.DrawFn) -> Kill:
    count = draw(st.integers(15, 30))
    keys = draw(st.lists(st.sampled_from(list("abcdef")), min_size=count, max_size=count))
    stuck = draw(st.frozensets(st.integers(0, count - 1), min_size=1, max_size=3))
    return Kill(
        keys=keys,
        aggregate_every=draw(st.sampled_from([0, 4])),
        latencies_ms=draw(st.lists(st.integers(0, 6), min_size=count, max_size=count)),
        stuck=stuck,
    )


async def run_kill(url: str, kill: Kill) -> None:
    stream, records = write_stream(url, kill.keys, kill.aggregate_every)
    app = f"{stream}-app"
    aws = AwsSettings(endpoint_url=url)
    settings_ = replace(BASE, dispatch=DispatchSettings(ordering="key"))
    # In key mode a stuck record holds up the later records of its key, nothing else.
    blocked_keys: set[str] = set()
    completable: set[int] = set()
    for index, key in enumerate(kill.keys):
        if index in kill.stuck:
            blocked_keys.add(key)
        elif key not in blocked_keys:
            completable.add(index)

    first: list[int] = []

    async def first_handler(record: ConsumedRecord[bytes]) -> None:
        index = int(record.data)
        if index in kill.stuck:
            await asyncio.Event().wait()  # hangs until the worker dies
        await asyncio.sleep(kill.latencies_ms[index] / 1000)
        first.append(index)

    worker = Consumer(stream, app, settings=settings_, aws=aws)
    run = asyncio.create_task(worker.consume(first_handler))
    try:
        await until(lambda: set(first) == completable, 30)
        # Wait until the lease holds everything the first worker finished.
        await until(
            lambda: (
                (done := stored_progress(url, app)) is not None
                and finished_by(done, records) == completable
            ),
            30,
        )
    finally:
        run.cancel()  # the kill: no final checkpoint, handlers in flight abandoned
        with contextlib.suppress(asyncio.CancelledError):
            await run
    done = stored_progress(url, app)
    assert done is not None
    assert finished_by(done, records) == completable

    second: list[int] = []
    order: dict[str, list[int]] = defaultdict(list)

    async def second_handler(record: ConsumedRecord[bytes]) -> None:
        index = int(record.data)
        order[record.partition_key].append(index)
        await asyncio.sleep(kill.latencies_ms[index] / 1000)
        second.append(index)

    window = set(range(len(records))) - completable
    successor = Consumer(stream, app, settings=settings_, aws=aws)
    run = asyncio.create_task(successor.consume(second_handler))
    try:
        await until(lambda: len(second) >= len(window) or run.done(), 30)
        await asyncio.sleep(0.3)  # anything more it would handle, it would handle now
    finally:
        await successor.stop()
        await run
    assert sorted(second) == sorted(window)  # exactly the incomplete window, once each
    for key, indexes in order.items():
        assert indexes == sorted(indexes), key
    assert stored_progress(url, app) == {records[-1].position}


@settings(EXAMPLES, max_examples=3)
@given(kill=kills())
def test_a_killed_workers_successor_handles_exactly_the_incomplete_window(
    moto_url: str, kill: Kill
) -> None:
    asyncio.run(run_kill(moto_url, kill))


# --- dead letters on a Kinesis stream, an idempotency guard in DynamoDB ------------------------


async def test_kinesis_dead_letters_and_a_dynamodb_guard_across_a_failover(moto_url: str) -> None:
    from shardflow.deadletter import KinesisDestination
    from shardflow.idempotency import DynamoDBIdempotencyGuard

    keys = [f"k{i % 3}" for i in range(10)]
    stream, records = write_stream(moto_url, keys, 0)
    dlq = f"{stream}-dlq"
    make_stream(moto_url, dlq, 1)
    aws = AwsSettings(endpoint_url=moto_url)
    calls: Counter[int] = Counter()
    handled: list[int] = []

    async def handle(record: ConsumedRecord[bytes]) -> None:
        index = int(record.data)
        calls[index] += 1
        if index == 4:
            raise ValueError("poison")
        handled.append(index)

    def letters() -> list[DeadLetter]:
        return [DeadLetter.from_json(r.data) for r in user_records(moto_url, dlq)]

    async def run_once(app: str, guard: DynamoDBIdempotencyGuard, expected_letters: int) -> None:
        dispatch = DispatchSettings(
            ordering="key",
            retry=QUICK_RETRY,
            on_failure="skip",
            idempotency=Idempotency(guard),
        )
        destination = KinesisDestination(dlq, aws=aws)
        consumer = Consumer(stream, app, settings=replace(BASE, dispatch=dispatch), aws=aws)
        run = asyncio.create_task(consumer.consume(handle, dead_letters=destination))
        try:
            await until(lambda: len(letters()) == expected_letters or run.done(), 30, every=0.2)
        finally:
            await consumer.close()
            await run
            await destination.close()

    async with DynamoDBIdempotencyGuard.connect(ClientFactory(aws), f"{stream}-once") as guard:
        await run_once(f"{stream}-app", guard, 1)
        assert sorted(handled) == [i for i in range(10) if i != 4]
        # A fresh application reads the stream again, as after a lost checkpoint: the guard
        # skips every handled record; the failed one was released, so it is tried again.
        await run_once(f"{stream}-again", guard, 2)
    assert sorted(handled) == [i for i in range(10) if i != 4]
    assert calls == Counter({i: 1 for i in range(10) if i != 4} | {4: 4})
    first, second = letters()
    assert (first.data, first.stream, first.shard_id) == (b"4", stream, records[4].shard_id)
    assert first.sequence_number == second.sequence_number == records[4].sequence_number
    assert (first.error_type, first.attempts) == ("ValueError", 2)
