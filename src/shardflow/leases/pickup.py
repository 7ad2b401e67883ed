"""Noticing lease changes between take cycles: the lease table's DynamoDB stream, or a poll.

A worker must learn within a few hundred milliseconds that a lease was released, handed to
it, or asked of it, and when an observed lease expires; a take cycle every 20 s is far too
slow for that. Two sources of :class:`LeaseChanges`:

- :class:`StreamChanges` reads the table's DynamoDB stream (NEW_AND_OLD_IMAGES): every write
  of any worker arrives as the item after the write. Each view is partial (the leases that
  changed); a GetRecords call per stream shard per ``interval`` whether or not anything
  changed.
- :class:`PollingChanges` scans the whole table every ``interval`` (consistent reads): each
  view is complete; on a heartbeat-mode table it reads only the table's change marker and the
  heartbeats while the marker stands still (partial views of the heartbeats).

Both are async iterators of :class:`LeaseView`; they run until cancelled, and a failing call
is logged and tried again next interval (the take cycle still runs meanwhile).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from shardflow.aws.backoff import retrying
from shardflow.backoff import Backoff
from shardflow.clock import Clock
from shardflow.errors import (
    AccessDeniedError,
    AwsError,
    ExpiredIteratorError,
    MalformedLeaseError,
    ThrottledError,
)
from shardflow.leases.entities import (
    HEARTBEAT_PREFIX,
    MODE_KEY,
    Heartbeat,
    LeaseMode,
    ModeSetting,
    entity_from_item,
)
from shardflow.leases.model import (
    LEASE_COUNTER,
    LEASE_OWNER,
    Lease,
    is_lease_item,
    lease_from_item,
)
from shardflow.leases.store import LeaseStore, LeaseStoreBase, TableMarks, TableScan

log = logging.getLogger("shardflow.leases")

_STREAM_BACKOFF = Backoff(base=0.05, cap=0.5, max_attempts=3)
THROTTLED_PAUSE_MAX = 5.0
"""Seconds between two reads of the lease table's stream at most while it throttles them."""
THROTTLE_LOG_EVERY = 60.0
"""Seconds between two warnings that the lease table's stream throttles reads."""
_REDESCRIBE_EVERY = 60.0
"""Seconds between DescribeStream calls that look for new stream shards (DynamoDB rolls its
stream shards over about every four hours; a closed shard also triggers one at once)."""
SCAN_RATE = 1_000
"""Lease items a poller scans a second at most: a table of up to 250 leases is scanned every
``pickup_poll_interval`` (0.25 s) as before, a 1,000-lease table once a second. Each scan
reads (and parses) every item of the table whatever changed: four scans a second of 1,000
leases were a quarter of an idle per-lease consumer's CPU and most of the objects its full
garbage collections walked (bench/consumer.py's scale part, profiled)."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """Leases as one read saw them. ``complete``: the whole table (missing keys are gone);
    otherwise only the leases that changed, and ``removed`` the keys of deleted items.
    ``resumed``: the stream is read again from its latest change (at the start, or after its
    iterators were lost): changes before this view may never be seen, so a picture of the
    table kept from earlier views is incomplete."""

    leases: tuple[Lease, ...]
    complete: bool
    removed: tuple[str, ...] = ()
    resumed: bool = False
    heartbeats: tuple[Heartbeat, ...] = ()
    """Heartbeat items as read (all of them in a complete view, the changed ones otherwise)."""
    removed_heartbeats: tuple[str, ...] = ()
    """Workers whose heartbeat item was deleted."""
    mode: LeaseMode | None = None
    mode_seen: bool = False
    """The view shows the table's lease mode (``mode``; None: no mode item, ``per-lease``)."""
    renewed: tuple[Lease, ...] = ()
    """Leases whose change moved only their counter (a renewal: same owner, checkpoint,
    request, everything else), each as after its latest change; kept apart from ``leases``
    because every worker of a per-lease fleet reads every renewal of every worker, and a
    renewal tells a peer only that the lease is alive (see ExpiryTracker.renewed)."""
    unchanged: bool = False
    """A complete view whose leases, mode and heartbeat holders are exactly the previous
    complete view's (only heartbeat counters moved): nothing to plan on that the last take
    cycle did not see (what time alone changes, expiry and overdue handoffs, wakes the take
    loop by itself)."""


class LeaseChanges(Protocol):
    """A source of lease views (see the module doc)."""

    def views(self) -> AsyncIterator[LeaseView]: ...


class PollingChanges:
    """Scans the lease table every ``interval`` seconds (a large table less often: at most
    ``SCAN_RATE`` leases a second); on a heartbeat-mode table whose leases all belong to
    workers with heartbeats, reads only the change marker and the heartbeats in between, and
    scans when the marker moved, a heartbeat came, went or was fenced, or ``full_every``
    seconds passed since the last scan (None: scan every time).

    Why: a 1,000-lease table scanned four times a second was most of an idle worker's CPU
    and 4,000 items read a second, while in the heartbeat mode nothing in it changes unless a
    worker moves a lease, and every such write bumps the marker (see
    :func:`~shardflow.leases.writes.noticed_by_peers`). The heartbeats are read every time:
    they are what tells a peer died. The periodic scan is the safety net for a bump that was
    lost (a writer that crashed between its write and the bump) and keeps seeing lease writers
    that keep no heartbeat (a worker that renews leases one by one: while one is seen, every
    poll scans)."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        interval: float,
        clock: Clock,
        full_every: float | None = None,
    ) -> None:
        self._store = store
        self._interval = interval
        self._clock = clock
        self._full_every = full_every
        self._marks_refused = False
        self.scans = 0
        self.mark_reads = 0
        """Whole-table scans and marker reads so far (for tests and the benches)."""

    async def views(self) -> AsyncIterator[LeaseView]:
        previous: tuple[tuple[Lease, ...], LeaseMode | None, frozenset[object]] | None = None
        marking = _Marking()
        while True:
            started = self._clock.monotonic()
            gap = self._interval
            try:
                store = self._store
                marks: TableMarks | None = None
                full_every = self._full_every
                if (
                    full_every is not None
                    and marking.eligible
                    and not self._marks_refused
                    and isinstance(store, LeaseStoreBase)
                ):
                    self.mark_reads += 1
                    try:
                        marks = await store.read_marks(marking.heartbeat_keys)
                    except AccessDeniedError as exc:
                        # A policy without dynamodb:BatchGetItem: scan every poll, as before.
                        self._marks_refused = True
                        log.warning(
                            "reading the lease table's change marker is not allowed (%s): "
                            "lease pick-up scans the whole table every poll",
                            exc,
                        )
                due = full_every is None or started - marking.scanned_at >= full_every
                if marks is not None and not due and marking.still(marks):
                    yield LeaseView(
                        (),
                        complete=False,
                        heartbeats=marks.heartbeats,
                        mode=marks.mode,
                        mode_seen=True,
                    )
                else:
                    self.scans += 1
                    if isinstance(store, LeaseStoreBase):
                        scan = await store.scan_table()
                    else:
                        scan = TableScan(await store.list_leases())
                    marking.scanned(scan, marks, started)
                    leases = tuple(scan.leases)
                    gap = max(gap, len(leases) / SCAN_RATE)
                    holders = marking.holders
                    unchanged = previous is not None and _same(previous, leases, scan.mode, holders)
                    previous = (leases, scan.mode, holders)
                    yield LeaseView(
                        leases,
                        complete=True,
                        heartbeats=scan.heartbeats,
                        mode=scan.mode,
                        mode_seen=True,
                        unchanged=unchanged,
                    )
            except AwsError as exc:
                log.warning("polling the lease table failed, tried again: %s", exc)
                previous = None  # something may have been missed: plan on the next one
                marking = _Marking()
            pause = gap - (self._clock.monotonic() - started)
            await self._clock.sleep(max(pause, 0.0))


class _Marking:
    """What :class:`PollingChanges` knows to judge, from the marks alone, that the table has
    not changed since its last scan."""

    def __init__(self) -> None:
        self.eligible = False
        """The last scan showed a heartbeat-mode table whose leases all belong to workers that
        keep heartbeats (lease by lease renewals need scans to be seen)."""
        self.base: int | None = None
        """The change marker as read just before the last scan (None: not read then)."""
        self.scanned_at = -math.inf
        self.holders: frozenset[tuple[str, str | None]] = frozenset()
        self.heartbeat_keys: tuple[str, ...] = ()

    def still(self, marks: TableMarks) -> bool:
        """Whether ``marks`` show the table as the last scan saw it: the marker read before
        that scan has not moved, and the same workers keep the same (un)fenced heartbeats."""
        return (
            self.base is not None
            and marks.mode == "heartbeat"
            and marks.changes == self.base
            and frozenset((hb.worker_id, hb.fenced_by) for hb in marks.heartbeats) == self.holders
        )

    def scanned(self, scan: TableScan, marks: TableMarks | None, at: float) -> None:
        """A scan made at ``at``, after ``marks`` were read (None: they were not)."""
        self.holders = frozenset((hb.worker_id, hb.fenced_by) for hb in scan.heartbeats)
        self.heartbeat_keys = tuple(hb.key for hb in scan.heartbeats)
        keepers = {hb.worker_id for hb in scan.heartbeats}
        self.eligible = scan.mode == "heartbeat" and all(
            (lease.lease_owner is None or lease.lease_owner in keepers)
            and (lease.checkpoint_owner is None or lease.checkpoint_owner in keepers)
            for lease in scan.leases
        )
        # Only a marker read before the scan may stand for it: one read after could count a
        # bump whose write the scan missed.
        self.base = marks.changes if marks is not None and marks.mode == "heartbeat" else None
        self.scanned_at = at


class StreamChanges:
    """Reads the lease table's DynamoDB stream ``stream_arn`` with the ``dynamodbstreams``
    client ``client``, from the moment it starts (LATEST), every ``interval`` seconds.

    DynamoDB Streams throttles a stream shard read by more than about two processes at once
    (AWS: "do not allow more than two processes to read from the same DynamoDB Streams shard
    at the same time"), and every worker of a fleet reads every shard of its lease table's
    stream. A read that is throttled doubles the pause before the next one, up to
    ``THROTTLED_PAUSE_MAX``; each read that is not halves it again, down to ``interval``: the
    fleet's reads settle at what the stream serves, instead of every worker retrying four
    times a second. Pick-up is slower then, never wrong (the take cycle's scans still see
    every change); the throttling is logged once a minute, not on every read."""

    def __init__(
        self,
        client: Any,
        stream_arn: str,
        *,
        interval: float,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._rng = rng
        self._arn = stream_arn
        self._interval = interval
        self._clock = clock
        self._iterators: dict[str, str] = {}
        self._known: set[str] = set()
        self._described_at: float | None = None
        self._throttled = False
        """The last read met throttling (see the class doc)."""
        self.pause = interval
        """Seconds between the starts of two reads now (``interval`` unless throttled)."""
        self.throttled_reads = 0
        self._throttle_logged_at = -math.inf

    async def _call(self, operation: str, **params: Any) -> Any:
        method = getattr(self._client, operation)
        name = "".join(part.title() for part in operation.split("_"))
        return await retrying(
            lambda: method(**params),
            operation=name,
            backoff=_STREAM_BACKOFF,
            rng=self._rng,
            sleep=self._clock.sleep,
        )

    async def _describe(self, *, first: bool) -> None:
        """Find open stream shards; iterators for new ones (LATEST at first, else from the
        start of the shard: it was created after we last looked)."""
        shards: list[dict[str, Any]] = []
        params: dict[str, Any] = {"StreamArn": self._arn}
        while True:
            answer = await self._call("describe_stream", **params)
            description = answer["StreamDescription"]
            shards += description.get("Shards", [])
            last = description.get("LastEvaluatedShardId")
            if not last:
                break
            params["ExclusiveStartShardId"] = last
        self._described_at = self._clock.monotonic()
        # Forget shards the stream no longer lists (trimmed after 24 h): bounded memory.
        self._known &= {shard["ShardId"] for shard in shards}
        for shard in shards:
            shard_id = shard["ShardId"]
            is_open = "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {})
            if shard_id in self._known or not is_open:
                self._known.add(shard_id)
                continue
            self._known.add(shard_id)
            answer = await self._call(
                "get_shard_iterator",
                StreamArn=self._arn,
                ShardId=shard_id,
                ShardIteratorType="LATEST" if first else "TRIM_HORIZON",
            )
            self._iterators[shard_id] = answer["ShardIterator"]

    async def views(self) -> AsyncIterator[LeaseView]:
        # A fresh start (also after a failure): iterators at LATEST of every open shard.
        self._known.clear()
        self._iterators.clear()
        await self._describe(first=True)
        yield LeaseView((), complete=False, resumed=True)
        while True:
            started = self._clock.monotonic()
            self._throttled = False
            try:
                view = await self._read_all()
            except ThrottledError as exc:
                self._throttled = True
                view = None
                self._note_throttling(exc, started)
            except AwsError as exc:
                log.warning("reading the lease table's stream failed, tried again: %s", exc)
                view = None
            if self._throttled:
                self.throttled_reads += 1
                self.pause = min(self.pause * 2, max(THROTTLED_PAUSE_MAX, self._interval))
            else:
                self.pause = max(self.pause / 2, self._interval)
            if view is not None and (
                view.leases
                or view.renewed
                or view.removed
                or view.resumed
                or view.heartbeats
                or view.mode_seen
            ):
                yield view
            pause = self.pause - (self._clock.monotonic() - started)
            await self._clock.sleep(max(pause, 0.0))

    def _note_throttling(self, exc: AwsError, now: float) -> None:
        if now - self._throttle_logged_at < THROTTLE_LOG_EVERY:
            return
        self._throttle_logged_at = now
        log.warning(
            "the lease table's stream throttles this worker's reads (%s): read every %.2f s "
            "now (at most %.0f s); lease pick-up is slower meanwhile. DynamoDB Streams serves "
            "about two readers a stream shard; a larger fleet may prefer pickup='poll'",
            exc,
            min(self.pause * 2, max(THROTTLED_PAUSE_MAX, self._interval)),
            THROTTLED_PAUSE_MAX,
        )

    async def _read_all(self) -> LeaseView:
        due = self._described_at is None or (
            self._clock.monotonic() - self._described_at >= _REDESCRIBE_EVERY
        )
        if due or not self._iterators:
            await self._describe(first=False)
        leases: dict[str, Lease] = {}
        renewed: dict[str, Lease] = {}
        removed: list[str] = []
        beats: dict[str, Heartbeat] = {}
        gone_beats: list[str] = []
        mode: LeaseMode | None = None
        mode_seen = False
        resumed = False
        for shard_id, iterator in list(self._iterators.items()):
            try:
                answer = await self._call("get_records", ShardIterator=iterator)
            except ExpiredIteratorError:
                # Iterators live 15 minutes; a long pause (a stopped laptop) outlives them.
                del self._iterators[shard_id]
                self._known.discard(shard_id)
                await self._describe(first=True)
                resumed = True
                continue
            except AwsError as exc:
                # The shards read before this one have moved their iterators on: what they
                # showed must be handed on now, or it is gone. This shard keeps its iterator
                # and the ones after it wait too (a child shard holds later changes of the
                # same leases than its parent), so the next read goes on from here in order.
                if isinstance(exc, ThrottledError):
                    self._throttled = True
                    self._note_throttling(exc, self._clock.monotonic())
                else:
                    log.warning("reading the lease table's stream failed, tried again: %s", exc)
                break
            following = answer.get("NextShardIterator")
            if following:
                self._iterators[shard_id] = following
            else:
                del self._iterators[shard_id]  # the shard closed: its children come next
                self._described_at = None
            for record in answer.get("Records", []):
                change = record.get("dynamodb", {})
                image = change.get("NewImage")
                old = change.get("OldImage")
                if (
                    old is not None
                    and image is not None
                    and _renewal_only(old, image)
                    and is_lease_item(image)
                ):
                    # The commonest record by far (every renewal of every worker): straight
                    # to the renewals, without the general path's look-ups.
                    lease = _parsed(image)
                    if lease is None:
                        continue
                    key = lease.lease_key
                    if key in leases:  # changed otherwise earlier in this read: stays so
                        leases[key] = lease
                    else:
                        renewed[key] = lease
                    continue
                key = change.get("Keys", {}).get("leaseKey", {}).get("S")
                if record.get("eventName") == "REMOVE" or image is None:
                    if key == MODE_KEY:
                        mode, mode_seen = None, True
                    elif key and key.startswith(HEARTBEAT_PREFIX):
                        worker = key[len(HEARTBEAT_PREFIX) :]
                        beats.pop(worker, None)
                        gone_beats.append(worker)
                    elif key:
                        leases.pop(key, None)
                        renewed.pop(key, None)
                        removed.append(key)
                    continue
                if not is_lease_item(image):
                    entity = entity_from_item(image)
                    if isinstance(entity, Heartbeat):
                        beats[entity.worker_id] = entity
                    elif isinstance(entity, ModeSetting):
                        mode, mode_seen = entity.mode, True
                    continue
                lease = _lease_of(image)
                if lease is None:
                    continue
                # The latest image of each lease wins (renewals went above; one after another
                # change of the same lease in this read keeps the lease among the changed).
                renewed.pop(lease.lease_key, None)
                leases[lease.lease_key] = lease
        return LeaseView(
            tuple(leases.values()),
            complete=False,
            renewed=tuple(renewed.values()),
            removed=tuple(removed),
            resumed=resumed,
            heartbeats=tuple(beats.values()),
            removed_heartbeats=tuple(gone_beats),
            mode=mode,
            mode_seen=mode_seen,
        )


def _same(
    previous: tuple[tuple[Lease, ...], LeaseMode | None, frozenset[object]],
    leases: tuple[Lease, ...],
    mode: LeaseMode | None,
    holders: frozenset[object],
) -> bool:
    """Whether a scan shows what ``previous`` showed (a store that reads an unchanged item
    into the same Lease object makes this an identity check)."""
    before, before_mode, before_holders = previous
    return (
        before_mode == mode
        and before_holders == holders
        and len(before) == len(leases)
        and all(a is b or a == b for a, b in zip(before, leases, strict=True))
    )


def _renewal_only(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether a change from item ``old`` to ``new`` moved only the lease counter (and the
    owner holds it: a free lease's changes are never renewals)."""
    if old is None or len(old) != len(new) or LEASE_OWNER not in new:
        return False
    # One dictionary comparison (in C) rather than one per attribute.
    counted = dict(old)
    counted[LEASE_COUNTER] = new.get(LEASE_COUNTER)
    return counted == new


def _lease_of(image: dict[str, Any]) -> Lease | None:
    if not is_lease_item(image):
        return None
    return _parsed(image)


def _parsed(image: dict[str, Any]) -> Lease | None:
    """The lease of ``image``, a lease item (see :func:`is_lease_item`); None if malformed."""
    try:
        return lease_from_item(image)
    except MalformedLeaseError as exc:
        log.warning("ignoring a malformed lease image of %s: %s", exc.lease_key, exc.reason)
        return None
