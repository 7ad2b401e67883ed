"""Properties of ShardDispatcher under random latencies, failures and bounds.

Each example runs a shard of records through a dispatcher on a fresh event loop; handler
latency is a random number of yields to the loop (no real time passes), and each record fails
its first few calls. The handler, the sink and an ack listener watch for broken rules as they
happen; the end state is checked against the records.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardflow.backoff import NO_BACKOFF
from shardflow.consumer.delivery import (
    DispatchSettings,
    FailurePolicy,
    OrderingMode,
    ShardDispatcher,
)
from shardflow.errors import DispatchStoppedError, HandlerError, KeyBlockedError
from shardflow.records import Record
from support.dispatch_kit import MemorySink, ZeroTimeClock, delivered, is_acked, shard_records

NO_KEY = "-"  # records with this partition key have no ordering key (the key function says None)


@dataclass(frozen=True)
class Scenario:
    keys: list[str]
    aggregate_every: int
    failing_calls: list[int]
    """How many first calls of each record fail."""
    latencies: list[int]
    """Yields to the loop inside each handler call."""
    ordering: OrderingMode
    policy: FailurePolicy
    attempts: int
    max_in_flight: int
    worker_limit: int | None
    refused_letters: set[int]
    """Indexes of records the sink refuses."""
    sink_yields: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(1, 30))
    key_pool = draw(st.sampled_from([["a"], ["a", "b"], ["a", "b", "c", NO_KEY], list("abcdefg")]))
    keys = draw(st.lists(st.sampled_from(key_pool), min_size=count, max_size=count))
    attempts = draw(st.integers(1, 3))
    # Mostly successes, some records that recover, some that fail for good.
    failing = draw(
        st.lists(
            st.one_of(st.just(0), st.just(0), st.integers(0, attempts + 1)),
            min_size=count,
            max_size=count,
        )
    )
    policy = draw(st.sampled_from(["skip", "block-key", "stop-shard"]))
    refused = (
        draw(st.sets(st.integers(0, count - 1), max_size=2))
        if policy != "stop-shard" and draw(st.integers(0, 4)) == 0
        else set()
    )
    return Scenario(
        keys=keys,
        aggregate_every=draw(st.sampled_from([0, 0, 3])),
        failing_calls=failing,
        latencies=draw(st.lists(st.integers(0, 6), min_size=count, max_size=count)),
        ordering=draw(st.sampled_from(["shard", "key", "unordered"])),
        policy=policy,
        attempts=attempts,
        max_in_flight=draw(st.integers(1, 8)),
        worker_limit=draw(st.one_of(st.none(), st.integers(1, 4))),
        refused_letters=refused,
        sink_yields=draw(st.integers(0, 3)),
    )


def ordering_key(record: Record) -> str | None:
    return None if record.partition_key == NO_KEY else record.partition_key


@dataclass
class Observed:
    """What happened, and every rule seen broken while it happened."""

    index: dict[int, int] = field(default_factory=dict)  # id(record) -> index
    first_start: list[int] = field(default_factory=list)  # record indexes, first call only
    calls: dict[int, int] = field(default_factory=dict)
    succeeded: dict[int, int] = field(default_factory=dict)
    running: set[int] = field(default_factory=set)
    running_keys: set[str] = field(default_factory=set)
    peak: int = 0
    violations: list[str] = field(default_factory=list)


class WatchingHandler:
    def __init__(self, scenario: Scenario, seen: Observed, records: list[Record]) -> None:
        self.scenario = scenario
        self.seen = seen
        self.records = records

    async def __call__(self, record: Record) -> None:
        seen, scenario = self.seen, self.scenario
        i = seen.index[id(record)]
        key = ordering_key(record)
        if scenario.ordering == "shard" and seen.running:
            seen.violations.append(f"shard mode: {i} started while {seen.running} ran")
        if scenario.ordering == "key" and key is not None:
            if key in seen.running_keys:
                seen.violations.append(f"key {key}: {i} overlaps another record of the key")
            seen.running_keys.add(key)
        seen.running.add(i)
        seen.peak = max(seen.peak, len(seen.running))
        call = seen.calls.get(i, 0) + 1
        seen.calls[i] = call
        if call == 1:
            seen.first_start.append(i)
        try:
            for _ in range(scenario.latencies[i]):
                await asyncio.sleep(0)
            if call <= scenario.failing_calls[i]:
                raise RuntimeError(f"record {i} call {call} fails")
        finally:
            seen.running.discard(i)
            if scenario.ordering == "key" and key is not None:
                seen.running_keys.discard(key)
        seen.succeeded[i] = seen.succeeded.get(i, 0) + 1


async def run(scenario: Scenario) -> None:
    records = shard_records(scenario.keys, aggregate_every=scenario.aggregate_every)
    seen = Observed(index={id(r): i for i, r in enumerate(records)})
    tracker = delivered(records)
    sink = MemorySink(
        refuse={records[i].position for i in scenario.refused_letters},
        yields=scenario.sink_yields,
    )
    letters_of = lambda: {seen.index[id(letter.record)] for letter in sink.letters}  # noqa: E731

    def check_safe_position() -> None:
        safe = tracker.safe_position
        finished = set(seen.succeeded) | letters_of()
        for i, record in enumerate(records):
            if safe is not None and record.position <= safe and i not in finished:
                seen.violations.append(f"safe position {safe} passes unfinished record {i}")

    tracker.add_listener(check_safe_position)
    dispatcher = ShardDispatcher(
        WatchingHandler(scenario, seen, records),
        tracker,
        DispatchSettings(
            ordering=scenario.ordering,
            key=ordering_key,
            max_in_flight_per_shard=scenario.max_in_flight,
            retry=replace(NO_BACKOFF, max_attempts=scenario.attempts),
            on_failure=scenario.policy,
        ),
        sink=sink,
        worker_limit=asyncio.Semaphore(scenario.worker_limit) if scenario.worker_limit else None,
        clock=ZeroTimeClock(),
    )
    stopped: DispatchStoppedError | None = None
    submitted = 0
    try:
        for record in records:
            await dispatcher.submit(record)
            submitted += 1
        await dispatcher.drain()
    except DispatchStoppedError as exc:
        stopped = exc
        with contextlib.suppress(DispatchStoppedError):
            await dispatcher.drain()

    assert seen.violations == []
    letters = [seen.index[id(letter.record)] for letter in sink.letters]
    assert dispatcher.in_flight == 0
    assert dispatcher._lanes == {}
    assert not dispatcher._tasks

    # Bounds.
    assert seen.peak <= scenario.max_in_flight
    if scenario.worker_limit is not None:
        assert seen.peak <= scenario.worker_limit
    if scenario.ordering == "shard":
        assert seen.first_start == sorted(seen.first_start)

    # Per-key order: the first call of a key's records comes in shard order.
    if scenario.ordering == "key":
        for key in set(scenario.keys) - {NO_KEY}:
            starts = [i for i in seen.first_start if scenario.keys[i] == key]
            assert starts == sorted(starts), (key, starts)

    # Exactly once: handled or dead-lettered, never both, never twice.
    assert all(count == 1 for count in seen.succeeded.values())
    assert len(letters) == len(set(letters))
    assert not set(letters) & set(seen.succeeded)
    finished = set(letters) | set(seen.succeeded)
    for i, record in enumerate(records):
        assert is_acked(tracker, record) == (i in finished), i
        assert seen.calls.get(i, 0) <= scenario.attempts
    if stopped is None:
        assert submitted == len(records)
        assert finished == set(range(len(records)))
        assert tracker.all_acked
    else:
        # Only a record that failed for good or a refused dead letter stops the shard.
        assert scenario.policy == "stop-shard" or scenario.refused_letters
    counts = dispatcher.counts
    assert counts.handled + counts.dead_lettered + counts.abandoned == submitted
    assert counts.handled == len(seen.succeeded)

    # Letters: a handler failure after every attempt, or a blocked key (no call at all).
    for letter in sink.letters:
        i = seen.index[id(letter.record)]
        if isinstance(letter.error, KeyBlockedError):
            assert scenario.policy == "block-key"
            assert letter.attempts == 0
            assert i not in seen.calls
        else:
            assert isinstance(letter.error, HandlerError)
            assert letter.attempts == scenario.attempts == seen.calls[i]
            assert scenario.failing_calls[i] >= scenario.attempts

    # block-key (ordered modes): after a record of a key failed for good, no later record of
    # that key reaches the handler.
    if scenario.policy == "block-key" and scenario.ordering != "unordered":
        for failed in range(len(records)):
            key = ordering_key(records[failed])
            if key is None or not (
                seen.calls.get(failed, 0) == scenario.attempts
                and scenario.failing_calls[failed] >= scenario.attempts
            ):
                continue
            later = [j for j in seen.calls if j > failed and scenario.keys[j] == key]
            assert later == [], (failed, later)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenarios())
def test_dispatch_rules_hold_under_random_latency_and_failures(scenario: Scenario) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await run(scenario)

    asyncio.run(bounded())
