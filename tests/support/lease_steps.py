"""Random lease histories for the stores, and an independent model of what each step must do.

:class:`LeaseMachine` (hypothesis.stateful) lets 3 workers renew, take, release, checkpoint,
hand off, ... 2 leases, each worker acting on its own (possibly stale) view of a lease. Every
step runs against every store of the machine (the in-memory one; in the integration replay
also DynamoDB) and each outcome is compared with :func:`expect`, a plain restatement of KCL's
rules written independently of :mod:`shardflow.leases.writes`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shardflow.leases import Lease, LeaseStore
from shardflow.leases.errors import LeaseConditionFailedError
from shardflow.records import SHARD_END, ExtendedSequenceNumber

WORKERS = ("w1", "w2", "w3")
KEYS = ("shardId-000000000000", "shardId-000000000001")
CHILDREN = frozenset({"shardId-000000000002", "shardId-000000000003"})

workers = st.sampled_from(WORKERS)
keys = st.sampled_from(KEYS)
positions = st.one_of(
    st.builds(
        ExtendedSequenceNumber,
        st.integers(0, 10**40).map(str),
        st.integers(0, 3),
    ),
    st.just(ExtendedSequenceNumber(SHARD_END)),
)


@dataclass(frozen=True)
class Step:
    op: str
    worker: str
    key: str
    arg: Any = None


# An outcome: ("ok", lease after the write), ("failed", lease as it is now) or ("invalid", None)
# when the call was refused before reaching the table.
Outcome = tuple[str, Lease | None]


async def run_step(store: LeaseStore, step: Step, view: Lease) -> Outcome:
    """Perform ``step`` on ``store`` with the worker's ``view`` of the lease."""
    w = step.worker
    try:
        if step.op == "renew":
            result: Lease | None = await store.renew(view, w, throughput_kbps=step.arg)
        elif step.op == "take":
            result = await store.take(view, w)
        elif step.op == "release":
            result = await store.release(view, w)
        elif step.op == "checkpoint":
            result = await store.checkpoint(view, w, step.arg)
        elif step.op == "prepare":
            result = await store.prepare_checkpoint(view, w, step.arg, pending_state=b"state")
        elif step.op == "handoff":
            result = await store.handoff(view, w, step.arg)
        elif step.op == "complete_handoff":
            result = await store.complete_handoff(view, w)
        elif step.op == "update_children":
            result = await store.update_children(view, CHILDREN)
        elif step.op == "delete":
            await store.delete(view)
            result = None
        elif step.op == "create":
            result = await store.create_if_absent(Lease.new(step.key))
        else:
            raise AssertionError(step.op)
    except LeaseConditionFailedError as failure:
        return ("failed", failure.current)
    except ValueError:
        return ("invalid", None)
    return ("ok", result)


def _holds(view: Lease, worker: str, truth: Lease) -> bool:
    """The worker processes the shard, judged with its view's idea of a pending handoff."""
    if view.checkpoint_owner is None:
        return truth.lease_owner == worker and truth.checkpoint_owner is None
    return truth.checkpoint_owner == worker and truth.lease_owner == view.lease_owner


def expect(step: Step, view: Lease, truth: Lease | None) -> Outcome:
    """What KCL's rules say ``step`` does to the table holding ``truth``."""
    w = step.worker

    def fail() -> Outcome:
        return ("failed", truth)

    if step.op == "create":
        return ("ok", Lease.new(step.key)) if truth is None else fail()
    if step.op == "handoff" and step.arg == w:
        return ("invalid", None)
    if step.op == "complete_handoff" and (view.lease_owner is None or view.checkpoint_owner != w):
        return ("invalid", None)
    if truth is None:
        return fail()
    same_counter = truth.lease_counter == view.lease_counter
    bump = truth.lease_counter + 1
    if step.op == "renew":
        if not (same_counter and _holds(view, w, truth)):
            return fail()
        throughput = step.arg if step.arg is not None else truth.throughput_kbps
        return ("ok", replace(truth, lease_counter=bump, throughput_kbps=throughput))
    if step.op == "take":
        if not (same_counter and truth.lease_owner == view.lease_owner):
            return fail()
        switched = (view.lease_owner is not None and view.lease_owner != w) or (
            view.checkpoint_owner == w
        )
        return (
            "ok",
            replace(
                truth,
                lease_owner=w,
                checkpoint_owner=None,
                lease_counter=bump,
                owner_switches_since_checkpoint=truth.owner_switches_since_checkpoint
                + int(switched),
            ),
        )
    if step.op == "release":
        if not (same_counter and _holds(view, w, truth)):
            return fail()
        owner = truth.lease_owner if view.checkpoint_owner is not None else None
        return (
            "ok",
            replace(truth, lease_owner=owner, checkpoint_owner=None, lease_counter=bump),
        )
    if step.op == "checkpoint":
        if not (same_counter and _holds(view, w, truth)):
            return fail()
        return (
            "ok",
            replace(
                truth,
                checkpoint=step.arg,
                owner_switches_since_checkpoint=0,
                pending_checkpoint=None,
                pending_checkpoint_state=None,
                lease_counter=bump,
            ),
        )
    if step.op == "prepare":
        if not (same_counter and _holds(view, w, truth)):
            return fail()
        return (
            "ok",
            replace(
                truth,
                pending_checkpoint=step.arg,
                pending_checkpoint_state=b"state",
                lease_counter=bump,
            ),
        )
    if step.op == "handoff":
        if not (truth.lease_owner == w and truth.checkpoint_owner is None):
            return fail()
        return ("ok", replace(truth, lease_owner=step.arg, checkpoint_owner=w))
    if step.op == "complete_handoff":
        if not (truth.lease_owner == view.lease_owner and truth.checkpoint_owner == w):
            return fail()
        return ("ok", replace(truth, checkpoint_owner=None, lease_counter=bump))
    if step.op == "update_children":
        return ("ok", replace(truth, child_shard_ids=CHILDREN))
    if step.op == "delete":
        if not (same_counter and truth.lease_owner == view.lease_owner):
            return fail()
        return ("ok", None)
    raise AssertionError(step.op)


class LeaseMachine(RuleBasedStateMachine):
    """Workers acting on shared leases; every store must agree with :func:`expect` each step.

    Subclasses provide :meth:`open_stores` (called with the machine's event loop running) and
    may override :meth:`close_stores`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stores: list[LeaseStore] = self.run(self.open_stores())
        self.truth: dict[str, Lease | None] = {}
        for key in KEYS:
            created = [self.run(store.create_if_absent(Lease.new(key))) for store in self.stores]
            assert all(lease == created[0] for lease in created)
            self.truth[key] = created[0]
        self.views: dict[tuple[str, str], Lease] = {
            (w, k): lease for w in WORKERS for k, lease in self.truth.items() if lease
        }
        self.history: list[tuple[Step, Outcome]] = []
        self.highest_counter = {key: 0 for key in KEYS}

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    async def open_stores(self) -> list[LeaseStore]:
        raise NotImplementedError

    async def close_stores(self) -> None:
        return None

    def teardown(self) -> None:
        try:
            self.run(self.close_stores())
        finally:
            self.loop.close()

    def perform(self, step: Step) -> None:
        view = self.views[(step.worker, step.key)]
        truth = self.truth[step.key]
        wanted = expect(step, view, truth)
        for store in self.stores:
            got = self.run(run_step(store, step, view))
            assert got == wanted, f"{type(store).__name__}: {step} on {truth} gave {got}"
        check_step(step, truth, wanted)
        self.history.append((step, wanted))
        kind, lease = wanted
        if kind == "ok":
            self.truth[step.key] = lease
        if lease is not None:
            self.views[(step.worker, step.key)] = lease

    @rule(worker=workers)
    def refresh(self, worker: str) -> None:
        listings = [self.run(store.list_leases()) for store in self.stores]
        expected = [lease for key, lease in sorted(self.truth.items()) if lease is not None]
        for listing in listings:
            assert listing == expected
        for lease in expected:
            self.views[(worker, lease.lease_key)] = lease

    def holder_acts(self, key: str, op: str, arg: Any = None) -> None:
        """The worker processing the shard acts on a fresh view (random workers mostly fail)."""
        truth = self.truth[key]
        if truth is None or truth.actual_owner is None:
            return
        self.views[(truth.actual_owner, key)] = truth
        self.perform(Step(op, truth.actual_owner, key, arg))

    @rule(key=keys)
    def holder_renews(self, key: str) -> None:
        self.holder_acts(key, "renew")

    @rule(key=keys, position=positions)
    def holder_checkpoints(self, key: str, position: ExtendedSequenceNumber) -> None:
        self.holder_acts(key, "checkpoint", position)

    @rule(key=keys, position=positions)
    def holder_prepares(self, key: str, position: ExtendedSequenceNumber) -> None:
        self.holder_acts(key, "prepare", position)

    @rule(key=keys)
    def holder_releases(self, key: str) -> None:
        self.holder_acts(key, "release")

    @rule(key=keys)
    def holder_completes_handoff(self, key: str) -> None:
        self.holder_acts(key, "complete_handoff")

    @rule(key=keys, to=workers)
    def holder_hands_off(self, key: str, to: str) -> None:
        self.holder_acts(key, "handoff", to)

    @rule(worker=workers, key=keys)
    def reread(self, worker: str, key: str) -> None:
        leases = [self.run(store.get(key)) for store in self.stores]
        assert all(lease == self.truth[key] for lease in leases)
        if leases[0] is not None:
            self.views[(worker, key)] = leases[0]

    @rule(worker=workers, key=keys, throughput=st.none() | st.sampled_from([0.5, 12.25, 1e3]))
    def renew(self, worker: str, key: str, throughput: float | None) -> None:
        self.perform(Step("renew", worker, key, throughput))

    @rule(worker=workers, key=keys)
    def take(self, worker: str, key: str) -> None:
        self.perform(Step("take", worker, key))

    @rule(worker=workers, key=keys)
    def release(self, worker: str, key: str) -> None:
        self.perform(Step("release", worker, key))

    @rule(worker=workers, key=keys, position=positions)
    def checkpoint(self, worker: str, key: str, position: ExtendedSequenceNumber) -> None:
        self.perform(Step("checkpoint", worker, key, position))

    @rule(worker=workers, key=keys, position=positions)
    def prepare(self, worker: str, key: str, position: ExtendedSequenceNumber) -> None:
        self.perform(Step("prepare", worker, key, position))

    @rule(worker=workers, key=keys, to=workers)
    def handoff(self, worker: str, key: str, to: str) -> None:
        self.perform(Step("handoff", worker, key, to))

    @rule(worker=workers, key=keys)
    def complete_handoff(self, worker: str, key: str) -> None:
        self.perform(Step("complete_handoff", worker, key))

    @rule(worker=workers, key=keys)
    def update_children(self, worker: str, key: str) -> None:
        self.perform(Step("update_children", worker, key))

    @rule(worker=workers, key=keys)
    def delete(self, worker: str, key: str) -> None:
        self.perform(Step("delete", worker, key))

    @rule(worker=workers, key=keys)
    def create(self, worker: str, key: str) -> None:
        self.perform(Step("create", worker, key))

    @invariant()
    def tables_hold_the_truth(self) -> None:
        for store in self.stores:
            for key, lease in self.truth.items():
                assert self.run(store.get(key)) == lease

    @invariant()
    def counters_never_go_back_and_owners_are_never_empty(self) -> None:
        for key, lease in self.truth.items():
            if lease is None:
                self.highest_counter[key] = 0  # a re-created lease starts again at 0
                continue
            assert lease.lease_counter >= self.highest_counter[key]
            self.highest_counter[key] = lease.lease_counter
            assert lease.lease_owner != ""
            assert lease.checkpoint_owner != ""


BUMPING = frozenset({"renew", "take", "release", "checkpoint", "prepare", "complete_handoff"})


def check_step(step: Step, before: Lease | None, outcome: Outcome) -> None:
    """Properties every step must have, whatever the details of :func:`expect`."""
    kind, after = outcome
    if kind == "failed":
        assert after == before, "a failed write changes nothing and reports the lease as it is"
        return
    if kind != "ok" or step.op in ("create", "delete"):
        return
    assert before is not None
    assert after is not None
    if step.op in BUMPING:
        assert after.lease_counter == before.lease_counter + 1
    else:
        assert after.lease_counter == before.lease_counter
    if step.op in ("renew", "checkpoint", "prepare", "release"):
        # Only the worker processing the shard can renew, checkpoint or release it.
        assert before.actual_owner == step.worker
    if step.op == "checkpoint":
        assert after.owner_switches_since_checkpoint == 0
        assert after.checkpoint == step.arg
