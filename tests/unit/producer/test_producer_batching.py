"""Request assembly: Kinesis' request limits, per-shard pacing, aggregation and key order."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardflow.aggregation import AggregateBuilder, deaggregate
from shardflow.producer.batching import (
    Aggregate,
    Lane,
    Pending,
    Request,
    RequestAssembler,
    new_pending,
)
from shardflow.producer.buffer import Epoch
from shardflow.producer.ratelimit import RateSettings, ShardRateLimiter
from shardflow.records import Record

MiB = 1024 * 1024
UNLIMITED = RateSettings(records_per_second=1e12, bytes_per_second=1e15)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class Records:
    """Makes records (each a future) numbered in creation order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.epoch = Epoch(loop.create_future())
        self.count = 0

    def make(self, key: str, data_size: int, accepted_at: float = 0.0) -> Pending:
        self.count += 1
        # The payload starts with the record's number so tests can tell records apart.
        head = f"{self.count:08d}".encode()
        data = (head + b"x" * max(0, data_size - len(head)))[: max(data_size, len(head))]
        return new_pending(
            self.loop,
            data,
            key,
            None,
            self.count,
            len(data) + len(key.encode()),
            self.epoch,
            accepted_at,
        )


def lane(shard_id: str = "shardId-000000000000", rate: RateSettings = UNLIMITED) -> Lane:
    return Lane(shard_id, ShardRateLimiter(rate, 0.0))


def assembler(**overrides: object) -> RequestAssembler:
    options: dict[str, object] = {
        "max_records": 500,
        "max_bytes": 5 * MiB,
        "shard_concurrency": 1,
    }
    options.update(overrides)
    return RequestAssembler(**options)  # type: ignore[arg-type]


def drain(assembly: RequestAssembler, lanes: list[Lane], now: float = 0.0) -> list[Request]:
    """Assemble requests until the lanes are empty, finishing each request at once."""
    requests = []
    for _ in range(10_000):
        survey = assembly.survey(lanes, now, linger=0.0, force=True)
        if not survey.eligible:
            break
        request = assembly.assemble(survey.eligible, now)
        assert request is not None
        requests.append(request)
        for done in request.lanes:
            done.in_flight -= 1
    assert all(not each.queue for each in lanes), "records left behind"
    return requests


def entry_size(entry: dict[str, object]) -> int:
    data = entry["Data"]
    key = entry["PartitionKey"]
    assert isinstance(data, bytes)
    assert isinstance(key, str)
    return len(data) + len(key.encode())


def user_records(request: Request) -> list[Pending]:
    out: list[Pending] = []
    for member in request.members:
        out.extend(member.records if isinstance(member, Aggregate) else [member])
    return out


def check_request_limits(request: Request, *, max_record: int = MiB) -> None:
    assert 1 <= len(request.payload) <= 500
    sizes = [entry_size(entry) for entry in request.payload]
    assert all(size <= max_record for size in sizes)
    assert sum(sizes) <= 5 * MiB
    assert request.nbytes == sum(sizes)
    assert len(request.members) == len(request.payload)


# Runs of small and of large records, so that both the 500-record and the 5 MiB limit bind.
record_sizes = st.lists(
    st.one_of(
        st.lists(st.integers(min_value=0, max_value=2_000), min_size=100, max_size=700),
        st.lists(st.integers(min_value=300_000, max_value=MiB - 64), min_size=1, max_size=12),
    ),
    min_size=1,
    max_size=4,
).map(lambda runs: [size for run in runs for size in run])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=record_sizes,
    lane_count=st.integers(min_value=1, max_value=4),
    keys=st.integers(min_value=1, max_value=50),
)
def test_plain_requests_respect_kinesis_limits_and_keep_lane_order(
    loop: asyncio.AbstractEventLoop, sizes: list[int], lane_count: int, keys: int
) -> None:
    make = Records(loop)
    lanes = [lane(f"shardId-{i:012d}") for i in range(lane_count)]
    queued: dict[str, list[int]] = defaultdict(list)
    for i, size in enumerate(sizes):
        record = make.make(f"key-{i % keys}", size)
        target = lanes[i % lane_count]
        target.append(record)
        queued[target.shard_id].append(record.hash_key)

    requests = drain(assembler(), lanes)

    sent: dict[str, list[int]] = defaultdict(list)
    for request in requests:
        check_request_limits(request)
        for record in user_records(request):
            assert record.lane is not None
            sent[record.lane.shard_id].append(record.hash_key)
    assert sent == queued  # every record once, each lane in its order
    assert all(each.queued_bytes == 0 for each in lanes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=300_000)
        ),
        min_size=20,
        max_size=400,
    ),
    keys=st.integers(min_value=1, max_value=20),
    aggregate_max=st.sampled_from([4_096, 64 * 1024, MiB]),
)
def test_aggregated_requests_hold_every_record_once_in_order(
    loop: asyncio.AbstractEventLoop, sizes: list[int], keys: int, aggregate_max: int
) -> None:
    make = Records(loop)
    single = lane()
    expected = []
    for i, size in enumerate(sizes):
        record = make.make(f"key-{i % keys}", size)
        single.append(record)
        expected.append(record.data)

    requests = drain(
        assembler(aggregation_max_bytes=aggregate_max, builder_factory=AggregateBuilder),
        [single],
    )

    sent = []
    for request in requests:
        check_request_limits(request)
        for member, entry in zip(request.members, request.payload, strict=True):
            if isinstance(member, Aggregate):
                assert len(member.records) >= 2
                assert entry_size(entry) <= aggregate_max
                # The aggregate's outer key is its first record's; its content, in order.
                assert entry["PartitionKey"] == member.records[0].partition_key
                unpacked = deaggregate(
                    Record(
                        data=entry["Data"],
                        partition_key=entry["PartitionKey"],
                        sequence_number="1",
                    )
                )
                assert [r.data for r in unpacked] == [r.data for r in member.records]
                assert [r.partition_key for r in unpacked] == [
                    r.partition_key for r in member.records
                ]
                sent.extend(r.data for r in member.records)
            else:
                assert entry["Data"] == member.data
                sent.append(member.data)
    assert sent == expected


def test_requests_split_at_500_records_and_at_5_mib(loop: asyncio.AbstractEventLoop) -> None:
    make = Records(loop)
    single = lane()
    for _ in range(1_200):
        single.append(make.make("k", 10))
    assert [len(r.payload) for r in drain(assembler(), [single])] == [500, 500, 200]
    for _ in range(12):
        single.append(make.make("k", 900_000))
    requests = drain(assembler(), [single])
    assert [len(r.payload) for r in requests] == [5, 5, 2]  # 5 x 900 kB < 5 MiB < 6 x 900 kB
    for request in requests:
        check_request_limits(request)


def test_small_records_are_packed_into_few_aggregates(loop: asyncio.AbstractEventLoop) -> None:
    make = Records(loop)
    single = lane()
    for i in range(5_000):
        single.append(make.make(f"key-{i}", 100))
    requests = drain(
        assembler(aggregation_max_bytes=MiB, builder_factory=AggregateBuilder), [single]
    )
    assert len(requests) == 1
    assert len(requests[0].payload) == 1  # 5,000 x ~110 bytes fit one aggregate
    assert requests[0].user_records == 5_000


def test_a_record_too_large_to_aggregate_is_sent_plain(loop: asyncio.AbstractEventLoop) -> None:
    make = Records(loop)
    single = lane()
    single.append(make.make("a", 10))
    big = make.make("b", MiB - 1)  # fits Kinesis' limit, not an aggregate's framing
    single.append(big)
    single.append(make.make("c", 10))
    requests = drain(
        assembler(aggregation_max_bytes=MiB, builder_factory=AggregateBuilder), [single]
    )
    members = [m for r in requests for m in r.members]
    assert big in members
    assert entry_size(requests[0].payload[0]) <= MiB


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.sampled_from("abcdefgh"), min_size=20, max_size=600),
    aggregate=st.booleans(),
)
def test_key_order_puts_a_key_in_one_kinesis_record_per_request(
    loop: asyncio.AbstractEventLoop, keys: list[str], aggregate: bool
) -> None:
    make = Records(loop)
    single = lane()
    for key in keys:
        single.append(make.make(key, 50))
    options: dict[str, object] = {"key_order": True, "max_records": 50}
    if aggregate:
        # room for about eight records per aggregate: several aggregates per request
        options |= {"aggregation_max_bytes": 600, "builder_factory": AggregateBuilder}

    requests = drain(assembler(**options), [single])

    order: dict[str, list[int]] = defaultdict(list)
    for request in requests:
        check_request_limits(request)
        seen_in_request: set[str] = set()
        for member in request.members:
            records = member.records if isinstance(member, Aggregate) else [member]
            member_keys = {r.partition_key for r in records}
            assert not member_keys & seen_in_request, "a key in two Kinesis records of a request"
            seen_in_request |= member_keys
            for record in records:
                order[record.partition_key].append(record.hash_key)
    for key, numbers in order.items():
        assert numbers == sorted(numbers), f"records of {key} out of order"
    assert sum(len(n) for n in order.values()) == len(keys)


def test_without_key_order_a_hot_key_fills_whole_requests(
    loop: asyncio.AbstractEventLoop,
) -> None:
    make = Records(loop)
    single = lane()
    for _ in range(1_000):
        single.append(make.make("hot", 10))
    assert [len(r.payload) for r in drain(assembler(), [single])] == [500, 500]
    for _ in range(10):
        single.append(make.make("hot", 10))
    assert [len(r.payload) for r in drain(assembler(key_order=True), [single])] == [1] * 10


def test_a_lane_gets_no_more_than_its_token_buckets_allow(
    loop: asyncio.AbstractEventLoop,
) -> None:
    make = Records(loop)
    slow = lane(rate=RateSettings(records_per_second=100, bytes_per_second=1e9, burst_seconds=1.0))
    narrow = lane(
        "shardId-000000000001",
        rate=RateSettings(records_per_second=1e6, bytes_per_second=10_000, burst_seconds=1.0),
    )
    for _ in range(300):
        slow.append(make.make("k", 10))
        narrow.append(make.make("k", 999))  # 1,000 bytes with the key
    assembly = assembler()
    survey = assembly.survey([slow, narrow], 0.0, linger=0.0, force=True)
    request = assembly.assemble(survey.eligible, 0.0)
    assert request is not None
    taken = defaultdict(int)
    for record in user_records(request):
        assert record.lane is not None
        taken[record.lane.shard_id] += 1
    assert taken == {slow.shard_id: 100, narrow.shard_id: 10}

    # Both lanes have used a second's worth: nothing is eligible until that second is over.
    slow.in_flight = narrow.in_flight = 0
    later = assembly.survey([slow, narrow], 0.0, linger=0.0, force=True)
    assert later.eligible == []
    assert later.wake_at == pytest.approx(1.0)
    assert assembly.survey([slow, narrow], 1.0, linger=0.0, force=True).eligible == [slow, narrow]


def test_a_lane_with_a_backlog_waits_for_a_quantum_of_tokens(
    loop: asyncio.AbstractEventLoop,
) -> None:
    make = Records(loop)
    paced = lane(rate=RateSettings(records_per_second=1000, burst_seconds=0.5))
    for _ in range(2_000):
        paced.append(make.make("k", 10))
    assembly = assembler(pace_quantum=0.05)
    drained = assembly.assemble(assembly.survey([paced], 0.0, 0.0, True).eligible, 0.0)
    assert drained is not None
    assert len(drained.payload) == 500
    paced.in_flight = 0
    # One token is back after 1 ms, but the lane waits for 50 records' worth.
    survey = assembly.survey([paced], 0.001, linger=0.0, force=True)
    assert survey.eligible == []
    assert survey.wake_at == pytest.approx(0.05)
    survey = assembly.survey([paced], 0.05, linger=0.0, force=True)
    assert survey.eligible == [paced]


def test_survey_waits_for_linger_unless_a_request_is_full(
    loop: asyncio.AbstractEventLoop,
) -> None:
    make = Records(loop)
    single = lane()
    assembly = assembler()
    for _ in range(10):
        single.append(make.make("k", 10, accepted_at=1.0))
    early = assembly.survey([single], 1.02, linger=0.05, force=False)
    assert not early.ready
    assert early.wake_at == pytest.approx(1.05)
    assert assembly.survey([single], 1.05, linger=0.05, force=False).ready
    assert assembly.survey([single], 1.02, linger=0.05, force=True).ready  # flushing
    for _ in range(490):
        single.append(make.make("k", 10, accepted_at=1.01))
    assert assembly.survey([single], 1.02, linger=0.05, force=False).ready  # 500 waiting


def test_survey_skips_paused_and_busy_lanes(loop: asyncio.AbstractEventLoop) -> None:
    make = Records(loop)
    paused, busy = lane("shardId-000000000000"), lane("shardId-000000000001")
    paused.append(make.make("a", 10))
    busy.append(make.make("b", 10))
    paused.resume_at = 2.0
    busy.in_flight = 1
    survey = assembler().survey([paused, busy], 1.0, linger=0.0, force=True)
    assert survey.eligible == []
    assert not survey.ready
    assert survey.wake_at == 2.0  # the busy lane is woken by its request finishing


def test_unknown_shard_lane_is_never_aggregated(loop: asyncio.AbstractEventLoop) -> None:
    make = Records(loop)
    unknown = lane("")
    for i in range(20):
        unknown.append(make.make(f"k{i}", 10))
    requests = drain(
        assembler(aggregation_max_bytes=MiB, builder_factory=AggregateBuilder), [unknown]
    )
    assert all(not isinstance(m, Aggregate) for r in requests for m in r.members)
    assert sum(len(r.payload) for r in requests) == 20
