"""Two extra lease attributes of planned moves: a joining worker's request that a busy worker
hand it a lease, and a leaving worker's word that it leaves.

The request lives in ``shardflowHandoffRequest`` (S), ``"<lease counter>:<requester id>"``.
KCL ignores attributes it does not know and its updates touch only its own, so the request
survives KCL's writes and a KCL owner simply never honours it (the requester then falls back
to a steal after ``handoff_timeout``). The counter it was made at dates it without clocks:
an owner honours a request only while the counter has moved on by at most
:data:`FRESH_RENEWALS` (about one failover time of renewals), so a request left behind by a
worker that went away is ignored rather than handing a lease to nobody.

The word lives in ``shardflowLeaving`` (S), ``"<lease counter>:<worker id>"``, written by a
worker on one lease it holds as it begins to leave: its peers leaving at the same moment then
choose neither it nor each other to hand their leases to. It counts only while the lease is
still that worker's and is as fresh as a request (a worker restarted with the same id renews
the lease on and the word lapses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shardflow.leases.model import Lease

HANDOFF_REQUEST: Final = "shardflowHandoffRequest"
LEAVING: Final = "shardflowLeaving"

FRESH_RENEWALS: Final = 3
"""Renewals (KCL: failover / 3 apart) after which an unanswered request is stale."""


@dataclass(frozen=True, slots=True)
class HandoffRequest:
    """Who asked for a lease, and the lease counter they saw when asking."""

    requester: str
    counter: int

    def encode(self) -> str:
        return f"{self.counter}:{self.requester}"

    def fresh_for(self, lease: Lease) -> bool:
        """Whether the owner of ``lease`` (as it is now) should still honour this request."""
        return 0 <= lease.lease_counter - self.counter <= FRESH_RENEWALS


def handoff_request_of(lease: Lease) -> HandoffRequest | None:
    """The request on ``lease``, if it carries a well-formed one (else None: ignored)."""
    value = lease.extra.get(HANDOFF_REQUEST)
    if value is None or not isinstance(value.get("S"), str):
        return None
    counter, _, requester = value["S"].partition(":")
    if not counter.isdigit() or not requester:
        return None
    return HandoffRequest(requester, int(counter))


def leaving_owner_of(lease: Lease) -> str | None:
    """The owner of ``lease`` if the lease carries its fresh word that it leaves, else None."""
    age = leaving_word_age(lease)
    return lease.lease_owner if age is not None and age <= FRESH_RENEWALS else None


def leaving_word_age(lease: Lease) -> int | None:
    """Counter bumps since the owner of ``lease`` wrote there that it leaves (None: no such
    word, or another worker's)."""
    value = lease.extra.get(LEAVING)
    if value is None or not isinstance(value.get("S"), str):
        return None
    counter, _, worker = value["S"].partition(":")
    if not counter.isdigit() or worker != lease.lease_owner:
        return None
    age = lease.lease_counter - int(counter)
    return age if age >= 0 else None
