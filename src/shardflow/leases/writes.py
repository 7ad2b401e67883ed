"""Every lease write as data: the condition it needs and what it changes, the way KCL does it.

Both stores execute these same descriptions (DynamoDB renders them into expressions, the
in-memory store interprets them), so the two cannot drift apart in what they check or change.

Where shardflow is stricter than KCL it says so; stricter never means a write KCL would make
succeed fails in a fleet where everyone follows the protocol (e.g. the owner check added to
renew holds whenever KCL's counter check holds, except during a handoff, which is handled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from shardflow.leases.handoff_request import HANDOFF_REQUEST, LEAVING, HandoffRequest
from shardflow.leases.model import (
    CHECKPOINT,
    CHECKPOINT_OWNER,
    CHECKPOINT_SUB,
    CHILD_SHARD_IDS,
    ENDING_HASH_KEY,
    LEASE_COUNTER,
    LEASE_KEY,
    LEASE_OWNER,
    OWNER_SWITCHES,
    PENDING_CHECKPOINT,
    PENDING_CHECKPOINT_STATE,
    PENDING_CHECKPOINT_SUB,
    SHARDFLOW_COMPLETED,
    STARTING_HASH_KEY,
    THROUGHPUT_KBPS,
    AttributeValue,
    Item,
    Lease,
    b,
    hash_range_attributes,
    lease_to_item,
    n,
    s,
    ss,
)
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange

SENTINELS: Final = frozenset({TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END})


# --- conditions and actions ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Equals:
    """The attribute exists and equals ``value`` (numbers compare as numbers)."""

    attribute: str
    value: AttributeValue


@dataclass(frozen=True, slots=True)
class Exists:
    attribute: str


@dataclass(frozen=True, slots=True)
class Absent:
    attribute: str


Condition = Equals | Exists | Absent


@dataclass(frozen=True, slots=True)
class Put:
    """Set the attribute to ``value`` (DynamoDB ``SET``)."""

    attribute: str
    value: AttributeValue


@dataclass(frozen=True, slots=True)
class Remove:
    attribute: str


@dataclass(frozen=True, slots=True)
class Add:
    """Add ``amount`` to a number attribute, starting from 0 if absent (DynamoDB ``ADD``)."""

    attribute: str
    amount: int


Action = Put | Remove | Add

WriteKind = Literal["update", "put", "delete"]


def _never(_: Lease | None) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class LeaseWrite:
    """One conditional write of one lease item.

    ``kind`` "update" changes only the attributes in ``actions``; "put" writes ``item`` whole
    (creation); "delete" removes the item. ``conditions`` all must hold.

    ``already_applied`` recognises, from the item found when the condition failed, that this
    very write had succeeded on an earlier attempt whose answer was lost (a retried timeout):
    KCL does the same check after a failed renew. Only consulted after such a retry.
    """

    operation: str
    lease_key: str
    kind: WriteKind
    conditions: tuple[Condition, ...]
    actions: tuple[Action, ...] = ()
    item: Item | None = None
    already_applied: Callable[[Lease | None], bool] = field(default=_never, compare=False)

    def __post_init__(self) -> None:
        touched = [action.attribute for action in self.actions]
        if len(touched) != len(set(touched)):
            raise ValueError(f"{self.operation}: an attribute is changed twice: {touched}")
        if LEASE_KEY in touched:
            raise ValueError(f"{self.operation}: the key attribute cannot be updated")


# --- validation ------------------------------------------------------------------------------


def _worker(worker_id: str, role: str) -> str:
    # An empty owner is a live worker named "" to KCL: such a lease is never picked up.
    if not isinstance(worker_id, str) or not worker_id:
        raise ValueError(f"{role} must be a non-empty worker id, got {worker_id!r}")
    return worker_id


def _position(position: ExtendedSequenceNumber, role: str) -> ExtendedSequenceNumber:
    seq = position.sequence_number
    if not (seq.isdigit() or seq in SENTINELS) or position.sub_sequence_number < 0:
        raise ValueError(f"{role} is not a valid position: {position!r}")
    return position


# --- pieces shared by several writes -----------------------------------------------------------


def _counter_is(lease: Lease) -> Equals:
    return Equals(LEASE_COUNTER, n(lease.lease_counter))


def _next_counter(lease: Lease) -> Put:
    return Put(LEASE_COUNTER, n(lease.lease_counter + 1))


def _owner_is(owner: str | None) -> Condition:
    return Absent(LEASE_OWNER) if owner is None else Equals(LEASE_OWNER, s(owner))


def _held_by(lease: Lease, worker_id: str) -> tuple[Condition, ...]:
    """``worker_id`` processes the shard: it is the owner and no handoff is pending, or — when
    the caller knows of a pending handoff — it is the checkpoint owner of that handoff."""
    if lease.checkpoint_owner is None:
        return (Equals(LEASE_OWNER, s(worker_id)), Absent(CHECKPOINT_OWNER))
    return (Equals(CHECKPOINT_OWNER, s(worker_id)), _owner_is(lease.lease_owner))


def _bumped_and_held(lease: Lease, worker_id: str) -> Callable[[Lease | None], bool]:
    def check(current: Lease | None) -> bool:
        return (
            current is not None
            and current.lease_counter == lease.lease_counter + 1
            and current.actual_owner == worker_id
        )

    return check


def _pending_actions(
    pending: ExtendedSequenceNumber | None, state: bytes | None, *, clear: bool
) -> list[Action]:
    if pending is not None:
        actions: list[Action] = [
            Put(PENDING_CHECKPOINT, s(pending.sequence_number)),
            Put(PENDING_CHECKPOINT_SUB, n(pending.sub_sequence_number)),
        ]
        # The state belongs to the prepared checkpoint: a new one without state drops the old.
        actions.append(
            Put(PENDING_CHECKPOINT_STATE, b(state))
            if state is not None
            else Remove(PENDING_CHECKPOINT_STATE)
        )
        return actions
    if clear:
        return [
            Remove(PENDING_CHECKPOINT),
            Remove(PENDING_CHECKPOINT_SUB),
            Remove(PENDING_CHECKPOINT_STATE),
        ]
    return []


def _checkpoint_actions(
    position: ExtendedSequenceNumber,
    completed_state: bytes | None,
    *,
    pending_actions: list[Action] | None = None,
) -> list[Action]:
    """Store ``position`` as the checkpoint: KCL's attributes plus shardflow's completed state
    (removed when None: the state of an older checkpoint means nothing). The prepared
    checkpoint is cleared unless ``pending_actions`` say otherwise."""
    return [
        Put(CHECKPOINT, s(position.sequence_number)),
        Put(CHECKPOINT_SUB, n(position.sub_sequence_number)),
        Put(OWNER_SWITCHES, n(0)),
        *(_pending_actions(None, None, clear=True) if pending_actions is None else pending_actions),
        (
            Put(SHARDFLOW_COMPLETED, b(completed_state))
            if completed_state is not None
            else Remove(SHARDFLOW_COMPLETED)
        ),
    ]


# --- the writes ----------------------------------------------------------------------------------


def create(lease: Lease) -> LeaseWrite:
    """PutItem of the whole lease if no item has its key (KCL createLeaseIfNotExists)."""
    for worker_id, role in (
        (lease.lease_owner, "lease_owner"),
        (lease.checkpoint_owner, "checkpoint_owner"),
    ):
        if worker_id is not None:
            _worker(worker_id, role)

    def same(current: Lease | None) -> bool:
        return (
            current is not None
            and current.lease_counter == lease.lease_counter
            and current.lease_owner == lease.lease_owner
            and current.checkpoint == lease.checkpoint
        )

    return LeaseWrite(
        "create",
        lease.lease_key,
        "put",
        (Absent(LEASE_KEY),),
        item=lease_to_item(lease),
        already_applied=same,
    )


def renew(lease: Lease, owner: str, *, throughput_kbps: float | None = None) -> LeaseWrite:
    """Bump the counter to show ``owner`` is alive.

    KCL conditions on the counter and (3.x) on no handoff pending unless it knows of one;
    shardflow also checks the owner. During a handoff the checkpoint owner keeps renewing.
    """
    _worker(owner, "owner")
    actions: list[Action] = [_next_counter(lease)]
    if throughput_kbps is not None:
        actions.append(Put(THROUGHPUT_KBPS, n(throughput_kbps)))
    return LeaseWrite(
        "renew",
        lease.lease_key,
        "update",
        (_counter_is(lease), *_held_by(lease, owner)),
        tuple(actions),
        already_applied=_bumped_and_held(lease, owner),
    )


def take(lease: Lease, new_owner: str) -> LeaseWrite:
    """Make ``new_owner`` the owner of a lease seen as ``lease`` (free, expired or stolen).

    As KCL takeLease: condition on the counter (shardflow adds the owner seen), counter + 1,
    leaseOwner := new owner, checkpointOwner removed (a fresh assignment, as 3.x), and
    ownerSwitchesSinceCheckpoint + 1 when the lease had another owner (not when it was free).
    """
    _worker(new_owner, "new_owner")
    actions: list[Action] = [
        _next_counter(lease),
        Put(LEASE_OWNER, s(new_owner)),
        Remove(CHECKPOINT_OWNER),
        Remove(HANDOFF_REQUEST),  # a new owner: any request to the old one is answered
        Remove(LEAVING),  # the old owner's word that it leaves
    ]
    old = lease.lease_owner
    if (old is not None and old != new_owner) or lease.checkpoint_owner == new_owner:
        actions.append(Add(OWNER_SWITCHES, 1))

    def taken(current: Lease | None) -> bool:
        return (
            current is not None
            and current.lease_counter == lease.lease_counter + 1
            and current.lease_owner == new_owner
            and current.checkpoint_owner is None
        )

    return LeaseWrite(
        "take",
        lease.lease_key,
        "update",
        (_counter_is(lease), _owner_is(old)),
        tuple(actions),
        already_applied=taken,
    )


def release(
    lease: Lease,
    owner: str,
    *,
    final_checkpoint: ExtendedSequenceNumber | None = None,
    completed_state: bytes | None = None,
) -> LeaseWrite:
    """Let go of a lease so that others may take it at once (KCL evictLease).

    KCL 2.x's evictLease (which 2.x itself never calls: its workers let leases expire) checks
    only the owner, removes leaseOwner and sets leaseCounter to the known counter + 1. 3.x also
    checks checkpointOwner, and when a handoff is pending removes only checkpointOwner so that
    the next owner starts at once. shardflow does the same and also checks the counter.

    With ``final_checkpoint`` the same write also stores the checkpoint (and the completed-record
    state, as :func:`checkpoint` does): a handoff's last checkpoint and the handover are then one
    conditional write, so the next owner starts from exactly what this write stored.
    """
    _worker(owner, "owner")
    actions: list[Action] = [_next_counter(lease), Remove(CHECKPOINT_OWNER)]
    if lease.checkpoint_owner is None:
        actions.append(Remove(LEASE_OWNER))
    if final_checkpoint is not None:
        _position(final_checkpoint, "final_checkpoint")
        actions += _checkpoint_actions(final_checkpoint, completed_state)
    elif completed_state is not None:
        raise ValueError("completed_state needs a final_checkpoint")

    def released(current: Lease | None) -> bool:
        return (
            current is not None
            and current.lease_counter == lease.lease_counter + 1
            and current.checkpoint_owner is None
            and current.lease_owner == (lease.lease_owner if lease.checkpoint_owner else None)
            and (final_checkpoint is None or current.checkpoint == final_checkpoint)
        )

    return LeaseWrite(
        "release",
        lease.lease_key,
        "update",
        (_counter_is(lease), *_held_by(lease, owner)),
        tuple(actions),
        already_applied=released,
    )


def checkpoint(
    lease: Lease,
    owner: str,
    position: ExtendedSequenceNumber,
    *,
    pending: ExtendedSequenceNumber | None = None,
    pending_state: bytes | None = None,
    clear_pending: bool = True,
    completed_state: bytes | None = None,
) -> LeaseWrite:
    """Record ``position`` as processed (KCL setCheckpoint via updateLease).

    Sets checkpoint and checkpointSubSequenceNumber, resets ownerSwitchesSinceCheckpoint to 0,
    bumps the counter. The prepared checkpoint is replaced by ``pending`` if given, else
    removed (with its state) unless ``clear_pending`` is False. ``shardflowCompleted`` is set to
    ``completed_state``, or removed when None (state of an older checkpoint means nothing).
    Conditions: counter and holder.
    """
    _worker(owner, "owner")
    _position(position, "position")
    if pending is not None:
        _position(pending, "pending")
    elif pending_state is not None:
        raise ValueError("pending_state needs a pending checkpoint")
    actions: list[Action] = [
        _next_counter(lease),
        *_checkpoint_actions(
            position,
            completed_state,
            pending_actions=_pending_actions(pending, pending_state, clear=clear_pending),
        ),
    ]
    held = _bumped_and_held(lease, owner)
    return LeaseWrite(
        "checkpoint",
        lease.lease_key,
        "update",
        (_counter_is(lease), *_held_by(lease, owner)),
        tuple(actions),
        already_applied=lambda cur: held(cur) and cur is not None and cur.checkpoint == position,
    )


def prepare_checkpoint(
    lease: Lease, owner: str, pending: ExtendedSequenceNumber, *, pending_state: bytes | None = None
) -> LeaseWrite:
    """Store a prepared (two-phase) checkpoint (KCL prepareCheckpoint): checkpoint unchanged."""
    _worker(owner, "owner")
    _position(pending, "pending")
    held = _bumped_and_held(lease, owner)
    return LeaseWrite(
        "prepare_checkpoint",
        lease.lease_key,
        "update",
        (_counter_is(lease), *_held_by(lease, owner)),
        (_next_counter(lease), *_pending_actions(pending, pending_state, clear=True)),
        already_applied=lambda cur: (
            held(cur) and cur is not None and cur.pending_checkpoint == pending
        ),
    )


def update_children(lease: Lease, child_shard_ids: Iterable[str]) -> LeaseWrite:
    """Record the children of an ended shard (KCL updateLeaseWithMetaInfo CHILD_SHARDS).

    As KCL: conditional only on the item existing, counter unchanged (so the owner's renewals
    and checkpoints do not fail because of it).
    """
    children = frozenset(child_shard_ids)
    return LeaseWrite(
        "update_children",
        lease.lease_key,
        "update",
        (Exists(LEASE_KEY),),
        (Put(CHILD_SHARD_IDS, ss(children)),),
    )


def update_hash_range(lease: Lease, hash_range: HashKeyRange) -> LeaseWrite:
    """Record the shard's hash-key range (KCL updateLeaseWithMetaInfo HASH_KEY_RANGE)."""
    attributes = hash_range_attributes(hash_range)
    return LeaseWrite(
        "update_hash_range",
        lease.lease_key,
        "update",
        (Exists(LEASE_KEY),),
        (
            Put(STARTING_HASH_KEY, attributes[STARTING_HASH_KEY]),
            Put(ENDING_HASH_KEY, attributes[ENDING_HASH_KEY]),
        ),
    )


def delete(lease: Lease) -> LeaseWrite:
    """Delete the item if it is still the lease we saw: same counter, same owner.

    KCL deletes unconditionally; the conditions keep a stale view from deleting a lease that
    moved on (e.g. re-created, or still being checkpointed).
    """
    return LeaseWrite(
        "delete",
        lease.lease_key,
        "delete",
        (_counter_is(lease), _owner_is(lease.lease_owner)),
        already_applied=lambda current: current is None,
    )


def handoff(lease: Lease, from_owner: str, to_owner: str) -> LeaseWrite:
    """Begin a graceful handoff (KCL 3.x initiateGracefulLeaseHandoff).

    leaseOwner := ``to_owner``, checkpointOwner := ``from_owner``; conditions: leaseOwner is
    ``from_owner``, no handoff pending, the item exists. The counter is neither checked nor
    bumped, as in KCL: the current owner keeps renewing meanwhile and must not lose the lease.
    """
    _worker(from_owner, "from_owner")
    _worker(to_owner, "to_owner")
    if from_owner == to_owner:
        raise ValueError("a handoff needs two different workers")
    return LeaseWrite(
        "handoff",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(from_owner)), Absent(CHECKPOINT_OWNER), Exists(LEASE_KEY)),
        (
            Put(LEASE_OWNER, s(to_owner)),
            Put(CHECKPOINT_OWNER, s(from_owner)),
            Remove(HANDOFF_REQUEST),  # answered
        ),
        already_applied=lambda current: (
            current is not None
            and current.lease_owner == to_owner
            and current.checkpoint_owner == from_owner
        ),
    )


def redirect_handoff(lease: Lease, via: str, to_owner: str) -> LeaseWrite:
    """Pass a handoff under way to ``via`` on to ``to_owner`` (a shardflow extension).

    For a next owner that is leaving itself: two workers stopping at the same moment may each
    have chosen the other. leaseOwner := ``to_owner``; conditions: leaseOwner is ``via`` and
    checkpointOwner is still the one seen (the old owner has not completed the handoff). As
    :func:`handoff`, the counter is neither checked nor bumped: the old owner keeps renewing
    and completes the handoff to ``to_owner`` (its completing write, refused once for the
    owner it knew, learns the new one from the refusal).
    """
    _worker(via, "via")
    _worker(to_owner, "to_owner")
    old = lease.checkpoint_owner
    if lease.lease_owner != via or old is None or old == via:
        raise ValueError(
            f"lease {lease.lease_key} shows no handoff to {via} "
            f"(leaseOwner={lease.lease_owner}, checkpointOwner={old})"
        )
    if to_owner in (via, old):
        raise ValueError("a handoff is passed on to a third worker")
    return LeaseWrite(
        "redirect_handoff",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(via)), Equals(CHECKPOINT_OWNER, s(old))),
        (Put(LEASE_OWNER, s(to_owner)),),
        already_applied=lambda current: (
            current is not None
            and current.lease_owner == to_owner
            and current.checkpoint_owner == old
        ),
    )


def complete_handoff(lease: Lease, from_owner: str) -> LeaseWrite:
    """Finish a handoff: the checkpoint owner lets the lease go to its new owner.

    As KCL 3.x (assignLease of the lease to its own leaseOwner, called by the checkpoint owner
    once it has checkpointed, or when the handoff timed out): conditions leaseOwner is the new
    owner and checkpointOwner is ``from_owner`` (the counter is not checked); removes
    checkpointOwner and adds 1 to the counter, which ends the old owner's hold.
    """
    _worker(from_owner, "from_owner")
    to_owner = lease.lease_owner
    if to_owner is None or lease.checkpoint_owner != from_owner:
        raise ValueError(
            f"lease {lease.lease_key} shows no handoff from {from_owner} "
            f"(leaseOwner={to_owner}, checkpointOwner={lease.checkpoint_owner})"
        )
    return LeaseWrite(
        "complete_handoff",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(to_owner)), Equals(CHECKPOINT_OWNER, s(from_owner))),
        (Put(LEASE_OWNER, s(to_owner)), Remove(CHECKPOINT_OWNER), Add(LEASE_COUNTER, 1)),
        already_applied=lambda current: (
            current is not None
            and current.lease_owner == to_owner
            and current.checkpoint_owner is None
        ),
    )


def mark_leaving(lease: Lease, owner: str) -> LeaseWrite:
    """Say on a lease ``owner`` holds that it leaves (a shardflow extension; see
    :mod:`~shardflow.leases.handoff_request`).

    Puts ``shardflowLeaving`` = ``"<counter>:<owner>"``. Conditions: the owner holds the lease
    and no handoff is under way; nothing else is touched (the counter neither), so renewals and
    checkpoints go on undisturbed.
    """
    _worker(owner, "owner")
    word = s(f"{lease.lease_counter}:{owner}")
    return LeaseWrite(
        "mark_leaving",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(owner)), Absent(CHECKPOINT_OWNER)),
        (Put(LEAVING, word),),
        already_applied=lambda current: current is not None and current.extra.get(LEAVING) == word,
    )


def decline_handoff(lease: Lease, owner: str) -> LeaseWrite:
    """Answer a handoff request on a lease ``owner`` holds with no (a shardflow extension):
    the owner keeps its share (see :func:`~shardflow.leases.balance.may_give`).

    Removes ``shardflowHandoffRequest`` if it is still the request seen on ``lease``, so the
    requester asks elsewhere and never steals the lease when its request times out (that
    fallback is for KCL workers, which ignore requests). Conditions: the owner holds the lease
    and the request is the one seen; nothing else is touched.
    """
    _worker(owner, "owner")
    request = lease.extra.get(HANDOFF_REQUEST)
    if request is None:
        raise ValueError(f"lease {lease.lease_key}: no handoff request to decline")
    return LeaseWrite(
        "decline_handoff",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(owner)), Equals(HANDOFF_REQUEST, dict(request))),
        (Remove(HANDOFF_REQUEST),),
        already_applied=lambda current: (
            current is not None and current.extra.get(HANDOFF_REQUEST) != request
        ),
    )


def request_handoff(lease: Lease, requester: str) -> LeaseWrite:
    """Ask the owner of ``lease`` to hand it to ``requester`` (a shardflow extension).

    Puts ``shardflowHandoffRequest`` (see :mod:`~shardflow.leases.handoff_request`); the
    owner sees it on its next renewal (UpdateItem returns the whole item) or on the lease
    table's stream. Conditions: the owner is still the one seen and no handoff is under way.
    Neither the counter nor anything else is touched, so the owner's renewals and checkpoints
    go on undisturbed; a later request overwrites an earlier one.
    """
    _worker(requester, "requester")
    owner = lease.lease_owner
    if owner is None or owner == requester:
        raise ValueError(f"lease {lease.lease_key}: a handoff can only be asked of another owner")
    request = HandoffRequest(requester, lease.lease_counter).encode()
    return LeaseWrite(
        "request_handoff",
        lease.lease_key,
        "update",
        (Equals(LEASE_OWNER, s(owner)), Absent(CHECKPOINT_OWNER)),
        (Put(HANDOFF_REQUEST, s(request)),),
        already_applied=lambda current: (
            current is not None and current.extra.get(HANDOFF_REQUEST) == s(request)
        ),
    )


# --- what peers should notice ----------------------------------------------------------------

QUIET_OPERATIONS: Final = frozenset(
    {"renew", "heartbeat", "prepare_checkpoint", "update_hash_range", "note_change"}
)
"""Writes no peer needs to learn of before its next scan: they move no lease between workers
(a renewal, a beat, a prepared checkpoint, the hash range), and the marker's own bump."""


def noticed_by_peers(write: LeaseWrite) -> bool:
    """Whether peers should learn of ``write`` within a pick-up interval (the heartbeat
    mode's change marker is bumped after it, see :mod:`~shardflow.leases.marker`): every
    write that can move a lease, free one, ask for one, add or remove one, or change who
    keeps a heartbeat. An ordinary checkpoint is quiet (a busy fleet writes many a second);
    one at SHARD_END is not: the shard's children may start."""
    if write.operation in QUIET_OPERATIONS:
        return False
    if write.operation == "checkpoint":
        return any(
            isinstance(action, Put)
            and action.attribute == CHECKPOINT
            and action.value.get("S") == SHARD_END
            for action in write.actions
        )
    return True
