"""Turning queued records into PutRecords requests within Kinesis' limits and each shard's pace.

Records wait in one :class:`Lane` per predicted shard. :meth:`RequestAssembler.survey` says
whether a request is worth sending now (a full request's worth is ready, or the oldest record
has lingered long enough) and, if not, when to look again; :meth:`RequestAssembler.assemble`
takes records from the lanes into one request: at most ``max_records`` Kinesis records and
``max_bytes`` bytes (data plus partition keys), no lane beyond its token buckets, and, when
aggregating, user records of one lane packed into KPL aggregates.

With ``key_order`` a partition key appears in at most one Kinesis record per request (an
aggregate may hold several records of the key, in order): if two records of a key travelled as
separate entries of one request, the first could fail and the second succeed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardflow.producer.buffer import Epoch
from shardflow.producer.ratelimit import ShardRateLimiter
from shardflow.producer.results import PutResult, ResultSink


class Pending(asyncio.Future[PutResult]):
    """One accepted user record on its way to Kinesis, and the future of its result.

    The record is its own future (``put`` returns it): one object per record instead of two,
    which matters at hundreds of thousands of records per second. When ``sink`` is set (the
    sync facade's ``concurrent.futures.Future``), the outcome goes there instead. Made by
    :func:`new_pending`: the class keeps the C ``Future.__init__``, half the cost of a Python
    one that calls it.
    """

    __slots__ = (
        "accepted_at",
        "attempts",
        "data",
        "epoch",
        "explicit_hash_key",
        "hash_key",
        "lane",
        "partition_key",
        "sink",
        "size",
    )

    data: bytes
    partition_key: str
    explicit_hash_key: str | None
    hash_key: int
    size: int  # data plus UTF-8 partition key, as Kinesis counts it
    epoch: Epoch
    accepted_at: float
    attempts: int
    lane: Lane | None
    sink: ResultSink | None

    def settle(self, result: PutResult | BaseException) -> None:
        """Hand over the outcome (unless the future was cancelled) and drop the payload."""
        target: ResultSink = self if self.sink is None else self.sink
        if not target.done():
            if isinstance(result, BaseException):
                target.set_exception(result)
            else:
                target.set_result(result)
        self.data = b""  # callers may keep futures for long; they need not keep payloads


def new_pending(
    loop: asyncio.AbstractEventLoop,
    data: bytes,
    partition_key: str,
    explicit_hash_key: str | None,
    hash_key: int,
    size: int,
    epoch: Epoch,
    accepted_at: float,
    sink: ResultSink | None = None,
) -> Pending:
    """A :class:`Pending` record, accepted at ``accepted_at``, not yet sent."""
    record = Pending(loop=loop)
    record.data = data
    record.partition_key = partition_key
    record.explicit_hash_key = explicit_hash_key
    record.hash_key = hash_key
    record.size = size
    record.epoch = epoch
    record.accepted_at = accepted_at
    record.attempts = 0
    record.lane = None
    record.sink = sink
    return record


class Lane:
    """The queue of one predicted shard, its pacing and its requests in flight.

    ``shard_id`` is "" for the lane of records no known shard covers (sent one by one, never
    aggregated, until the shard map is refreshed).
    """

    __slots__ = ("in_flight", "limiter", "queue", "queued_bytes", "resume_at", "shard_id")

    def __init__(self, shard_id: str, limiter: ShardRateLimiter) -> None:
        self.shard_id = shard_id
        self.limiter = limiter
        self.queue: deque[Pending] = deque()
        self.queued_bytes = 0
        self.in_flight = 0
        self.resume_at = 0.0  # no new request before this time (backoff after failures)

    def append(self, record: Pending) -> None:
        record.lane = self
        self.queue.append(record)
        self.queued_bytes += record.size

    def push_front(self, records: Sequence[Pending]) -> None:
        """Put records (in their order) before everything queued: retries go first."""
        for record in records:
            record.lane = self
            self.queued_bytes += record.size
        self.queue.extendleft(reversed(records))


class Aggregate:
    """Several user records of one lane sent as one KPL aggregated Kinesis record."""

    __slots__ = ("lane", "records")

    def __init__(self, lane: Lane, records: list[Pending]) -> None:
        self.lane = lane
        self.records = records


class Request:
    """One PutRecords call: ``members[i]`` is what ``payload[i]`` carries."""

    __slots__ = ("generation", "lanes", "members", "nbytes", "payload", "sent_at", "user_records")

    def __init__(self, sent_at: float, generation: int) -> None:
        self.members: list[Pending | Aggregate] = []
        self.payload: list[dict[str, Any]] = []
        self.lanes: list[Lane] = []
        self.nbytes = 0
        self.user_records = 0
        self.sent_at = sent_at
        self.generation = generation


class Builder(Protocol):
    """What assembly needs of :class:`shardflow.aggregation.AggregateBuilder`."""

    def try_add(
        self, partition_key: str, data: bytes, explicit_hash_key: str | None = None
    ) -> bool:
        """Add the record, or return False (unchanged) if the aggregate would grow too large."""
        ...

    def __len__(self) -> int: ...

    def build(self) -> Any:
        """An object with ``partition_key``, ``explicit_hash_key``, ``data`` and ``size``."""
        ...


@dataclass(slots=True)
class Survey:
    """What the lanes allow now: lanes that may send, whether to send, when to look again."""

    eligible: list[Lane]
    ready: bool
    wake_at: float | None


def entry_of(record: Pending) -> dict[str, Any]:
    """The PutRecords entry for a plain (not aggregated) record."""
    if record.explicit_hash_key is None:
        return {"Data": record.data, "PartitionKey": record.partition_key}
    return {
        "Data": record.data,
        "PartitionKey": record.partition_key,
        "ExplicitHashKey": record.explicit_hash_key,
    }


class RequestAssembler:
    """Builds PutRecords requests from lanes; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        max_records: int,
        max_bytes: int,
        shard_concurrency: int,
        key_order: bool = False,
        aggregation_max_bytes: int | None = None,
        builder_factory: Callable[[int], Builder] | None = None,
        pace_quantum: float = 0.05,
    ) -> None:
        if aggregation_max_bytes is not None and builder_factory is None:
            raise ValueError("aggregation needs a builder_factory")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.shard_concurrency = shard_concurrency
        self.key_order = key_order
        self.aggregation_max_bytes = aggregation_max_bytes
        self._builder_factory = builder_factory
        self.pace_quantum = pace_quantum
        # How far to look past records held back by the key-order rule before giving up.
        self._scan_limit = 4 * max_records
        self._rotation = 0

    def survey(self, lanes: Sequence[Lane], now: float, linger: float, force: bool) -> Survey:
        """Which lanes may send now, whether a request should go now, and when to check again.

        A request should go when ``force`` is set, when the oldest sendable record has waited
        ``linger``, or when the sendable records fill a request.
        """
        eligible: list[Lane] = []
        wake_at: float | None = None
        aggregating = self.aggregation_max_bytes is not None
        quantum = self.pace_quantum
        due = force
        sendable_records = 0
        sendable_bytes = 0.0
        for lane in lanes:
            queue = lane.queue
            if not queue or lane.in_flight >= self.shard_concurrency:
                continue  # a finishing request wakes the producer
            if lane.resume_at > now:
                wake_at = _earliest(wake_at, lane.resume_at)
                continue
            head = queue[0]
            # A lane with a backlog waits for a quantum of tokens, not just for its head record:
            # sending each record the moment one token is back would mean a call per record.
            limiter = lane.limiter
            need_records = 1
            if not aggregating or not lane.shard_id:
                need_records = min(len(queue), max(1, int(limiter.records_per_second * quantum)))
            need_bytes = min(
                lane.queued_bytes, max(head.size, int(limiter.bytes_per_second * quantum))
            )
            wait = limiter.seconds_until(need_records, need_bytes, now)
            if wait > 0:
                wake_at = _earliest(wake_at, now + wait)
                continue
            eligible.append(lane)
            linger_end = head.accepted_at + linger
            if linger_end <= now:
                due = True
            else:
                wake_at = _earliest(wake_at, linger_end)
            if not due:
                records, nbytes, _ = lane.limiter.allowance(now)
                sendable_records += min(len(queue), records)
                sendable_bytes += min(lane.queued_bytes, nbytes)
        full = sendable_bytes >= self.max_bytes or (
            self.aggregation_max_bytes is None and sendable_records >= self.max_records
        )
        return Survey(eligible, bool(eligible) and (due or full), wake_at)

    def assemble(self, lanes: Sequence[Lane], now: float, generation: int = 0) -> Request | None:
        """One request from ``lanes`` (as :meth:`survey` found them eligible); None if empty.

        Lanes are visited from a rotating start so that none is always served last.
        """
        request = Request(now, generation)
        count = len(lanes)
        if count == 0:
            return None
        start = self._rotation % count
        self._rotation += 1
        keys: set[str] | None = set() if self.key_order else None
        for i in range(count):
            if len(request.payload) >= self.max_records or request.nbytes >= self.max_bytes:
                break
            lane = lanes[(start + i) % count]
            if self.aggregation_max_bytes is not None and lane.shard_id:
                taken = self._take_aggregated(lane, request, now, keys)
            else:
                taken = self._take_plain(lane, request, now, keys)
            if taken:
                lane.in_flight += 1
                request.lanes.append(lane)
        return request if request.payload else None

    def _take_plain(self, lane: Lane, request: Request, now: float, keys: set[str] | None) -> bool:
        allowed_records, allowed_bytes, full = lane.limiter.allowance(now)
        records_room = min(allowed_records, self.max_records - len(request.payload))
        bytes_room = self.max_bytes - request.nbytes
        queue = lane.queue
        members = request.members
        payload = request.payload
        taken = 0
        taken_bytes = 0
        skipped: list[Pending] = []
        scanned = 0
        while queue and taken < records_room:
            record = queue[0]
            if keys is not None:
                scanned += 1
                if record.partition_key in keys:
                    # A record of this key is already in the request: it waits for the next.
                    skipped.append(queue.popleft())
                    if scanned >= self._scan_limit:
                        break
                    continue
            size = record.size
            if size > bytes_room - taken_bytes or (
                taken_bytes + size > allowed_bytes and not (taken == 0 and full)
            ):
                break
            queue.popleft()
            if keys is not None:
                keys.add(record.partition_key)
            members.append(record)
            # (entry_of, inlined: this runs once per record)
            if record.explicit_hash_key is None:
                payload.append({"Data": record.data, "PartitionKey": record.partition_key})
            else:
                payload.append(entry_of(record))
            taken += 1
            taken_bytes += size
        if skipped:
            queue.extendleft(reversed(skipped))
        if taken:
            self._charge(lane, request, taken, taken_bytes, taken, now)
        return taken > 0

    def _take_aggregated(
        self, lane: Lane, request: Request, now: float, keys: set[str] | None
    ) -> bool:
        assert self.aggregation_max_bytes is not None
        assert self._builder_factory is not None
        allowed_records, allowed_bytes, full = lane.limiter.allowance(now)
        records_room = min(allowed_records, self.max_records - len(request.payload))
        queue = lane.queue
        kinesis_records = 0
        taken_bytes = 0
        user_records = 0
        while queue and kinesis_records < records_room:
            bytes_room = self.max_bytes - request.nbytes - taken_bytes
            limit = min(self.aggregation_max_bytes, bytes_room, int(allowed_bytes) - taken_bytes)
            group, built, skipped = self._fill_aggregate(queue, limit, keys)
            if not group:
                # The head fits no aggregate under the limits: perhaps it may go on its own.
                if skipped:
                    queue.extendleft(reversed(skipped))
                head = queue[0] if queue else None
                if head is None or not self._fits_alone(
                    head, bytes_room, allowed_bytes - taken_bytes, kinesis_records == 0 and full
                ):
                    break
                if keys is not None and head.partition_key in keys:
                    break
                group = [queue.popleft()]
                skipped = []
            if skipped:
                queue.extendleft(reversed(skipped))
            if len(group) == 1:
                record = group[0]
                request.members.append(record)
                request.payload.append(entry_of(record))
                size = record.size
            else:
                request.members.append(Aggregate(lane, group))
                entry = {"Data": built.data, "PartitionKey": built.partition_key}
                if built.explicit_hash_key is not None:
                    entry["ExplicitHashKey"] = built.explicit_hash_key
                request.payload.append(entry)
                size = built.size
            if keys is not None:
                keys.update(record.partition_key for record in group)
            request.nbytes += size
            kinesis_records += 1
            taken_bytes += size
            user_records += len(group)
            lane.queued_bytes -= sum(record.size for record in group)
        if kinesis_records:
            lane.limiter.consume(kinesis_records, taken_bytes, now)
            request.user_records += user_records
        return kinesis_records > 0

    def _fill_aggregate(
        self, queue: deque[Pending], limit: int, keys: set[str] | None
    ) -> tuple[list[Pending], Any, list[Pending]]:
        """Records from the queue's head packed into one aggregate of at most ``limit`` bytes.

        Returns the records taken, the built aggregate (None unless two or more were taken) and
        records passed over for the key-order rule (to go back to the queue's head).
        """
        group: list[Pending] = []
        skipped: list[Pending] = []
        if limit <= 0:
            return group, None, skipped
        assert self._builder_factory is not None
        builder = self._builder_factory(limit)
        scanned = 0
        while queue:
            record = queue[0]
            if keys is not None and record.partition_key in keys:
                scanned += 1
                skipped.append(queue.popleft())
                if scanned >= self._scan_limit:
                    break
                continue
            if not builder.try_add(record.partition_key, record.data, record.explicit_hash_key):
                break
            group.append(queue.popleft())
        built = builder.build() if len(group) > 1 else None
        return group, built, skipped

    def _fits_alone(
        self, record: Pending, bytes_room: int, allowed_bytes: float, bucket_full: bool
    ) -> bool:
        return record.size <= bytes_room and (record.size <= allowed_bytes or bucket_full)

    def _charge(
        self,
        lane: Lane,
        request: Request,
        kinesis_records: int,
        nbytes: int,
        user_records: int,
        now: float,
    ) -> None:
        lane.queued_bytes -= nbytes
        lane.limiter.consume(kinesis_records, nbytes, now)
        request.nbytes += nbytes
        request.user_records += user_records


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None or candidate < current else current
