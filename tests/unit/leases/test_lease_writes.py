"""Each lease write's conditions and changes, checked against what KCL does (as data)."""

from __future__ import annotations

import pytest

from shardflow.leases import Lease
from shardflow.leases import writes as w
from shardflow.leases.dynamodb import render
from shardflow.leases.writes import Absent, Add, Equals, Exists, Put, Remove
from shardflow.records import SHARD_END, ExtendedSequenceNumber
from shardflow.shards import HashKeyRange

HELD = Lease("shardId-1", lease_owner="a", lease_counter=7, owner_switches_since_checkpoint=2)
HANDING_OFF = Lease("shardId-1", lease_owner="b", checkpoint_owner="a", lease_counter=7)
POSITION = ExtendedSequenceNumber("4959", 3)


def _unordered(actions: object) -> list[str]:
    return sorted(map(repr, actions))  # type: ignore[call-overload]


def test_create_puts_the_whole_item_if_the_key_is_free() -> None:
    write = w.create(Lease.new("shardId-1"))
    assert write.kind == "put"
    assert write.conditions == (Absent("leaseKey"),)
    assert write.item is not None
    assert write.item["leaseKey"] == {"S": "shardId-1"}


def test_renew_checks_counter_owner_and_no_handoff_and_bumps_the_counter() -> None:
    write = w.renew(HELD, "a")
    assert write.conditions == (
        Equals("leaseCounter", {"N": "7"}),
        Equals("leaseOwner", {"S": "a"}),
        Absent("checkpointOwner"),
    )
    assert write.actions == (Put("leaseCounter", {"N": "8"}),)
    with_rate = w.renew(HELD, "a", throughput_kbps=1.5)
    assert Put("throughputKBps", {"N": "1.5"}) in with_rate.actions


def test_the_checkpoint_owner_renews_during_a_handoff() -> None:
    write = w.renew(HANDING_OFF, "a")
    assert write.conditions == (
        Equals("leaseCounter", {"N": "7"}),
        Equals("checkpointOwner", {"S": "a"}),
        Equals("leaseOwner", {"S": "b"}),
    )


def test_take_from_another_owner_counts_a_switch() -> None:
    write = w.take(HELD, "c")
    assert write.conditions == (
        Equals("leaseCounter", {"N": "7"}),
        Equals("leaseOwner", {"S": "a"}),
    )
    assert write.actions == (
        Put("leaseCounter", {"N": "8"}),
        Put("leaseOwner", {"S": "c"}),
        Remove("checkpointOwner"),
        Remove("shardflowHandoffRequest"),
        Remove("shardflowLeaving"),
        Add("ownerSwitchesSinceCheckpoint", 1),
    )


def test_take_of_a_free_lease_or_own_lease_counts_no_switch() -> None:
    free = Lease("shardId-1", lease_counter=3)
    assert w.take(free, "c").conditions[1] == Absent("leaseOwner")
    assert not any(isinstance(action, Add) for action in w.take(free, "c").actions)
    assert not any(isinstance(action, Add) for action in w.take(HELD, "a").actions)


def test_release_removes_the_owner_and_bumps_the_counter() -> None:
    write = w.release(HELD, "a")
    assert write.conditions == w.renew(HELD, "a").conditions
    assert _unordered(write.actions) == _unordered(
        [Put("leaseCounter", {"N": "8"}), Remove("checkpointOwner"), Remove("leaseOwner")]
    )


def test_release_during_a_handoff_passes_the_lease_on_like_kcl_3_evict() -> None:
    write = w.release(HANDING_OFF, "a")
    assert _unordered(write.actions) == _unordered(
        [Put("leaseCounter", {"N": "8"}), Remove("checkpointOwner")]
    )


def test_checkpoint_sets_position_resets_switches_and_clears_the_prepared_one() -> None:
    write = w.checkpoint(HELD, "a", POSITION)
    assert write.conditions == w.renew(HELD, "a").conditions
    assert _unordered(write.actions) == _unordered(
        [
            Put("leaseCounter", {"N": "8"}),
            Put("checkpoint", {"S": "4959"}),
            Put("checkpointSubSequenceNumber", {"N": "3"}),
            Put("ownerSwitchesSinceCheckpoint", {"N": "0"}),
            Remove("pendingCheckpoint"),
            Remove("pendingCheckpointSubSequenceNumber"),
            Remove("pendingCheckpointState"),
            Remove("shardflowCompleted"),
        ]
    )


def test_checkpoint_stores_the_completed_state_in_shardflows_own_attribute() -> None:
    write = w.checkpoint(HELD, "a", POSITION, completed_state=b"\x01s")
    assert Put("shardflowCompleted", {"B": b"\x01s"}) in write.actions
    assert Remove("pendingCheckpoint") in write.actions  # never disguised as a KCL one


def test_checkpoint_can_keep_or_replace_the_prepared_one() -> None:
    kept = w.checkpoint(HELD, "a", ExtendedSequenceNumber(SHARD_END), clear_pending=False)
    assert not any(a.attribute.startswith("pending") for a in kept.actions)
    replaced = w.checkpoint(
        HELD, "a", POSITION, pending=ExtendedSequenceNumber("5000"), pending_state=b"s"
    )
    assert Put("pendingCheckpoint", {"S": "5000"}) in replaced.actions
    assert Put("pendingCheckpointState", {"B": b"s"}) in replaced.actions


def test_prepare_checkpoint_leaves_the_checkpoint_alone() -> None:
    write = w.prepare_checkpoint(HELD, "a", ExtendedSequenceNumber("5000", 1))
    attributes = {action.attribute for action in write.actions}
    assert attributes == {
        "leaseCounter",
        "pendingCheckpoint",
        "pendingCheckpointSubSequenceNumber",
        "pendingCheckpointState",
    }


def test_metadata_updates_only_need_the_item_and_leave_the_counter() -> None:
    children = w.update_children(HELD, ["shardId-3", "shardId-2"])
    assert children.conditions == (Exists("leaseKey"),)
    assert children.actions == (Put("childShardIds", {"SS": ["shardId-2", "shardId-3"]}),)
    hashes = w.update_hash_range(HELD, HashKeyRange(0, 10))
    assert hashes.conditions == (Exists("leaseKey"),)
    assert {a.attribute for a in hashes.actions} == {"startingHashKey", "endingHashKey"}


def test_delete_only_if_unchanged() -> None:
    write = w.delete(HELD)
    assert write.kind == "delete"
    assert write.conditions == (
        Equals("leaseCounter", {"N": "7"}),
        Equals("leaseOwner", {"S": "a"}),
    )


def test_handoff_is_kcl_3_initiate_graceful_lease_handoff() -> None:
    write = w.handoff(HELD, "a", "b")
    assert write.conditions == (
        Equals("leaseOwner", {"S": "a"}),
        Absent("checkpointOwner"),
        Exists("leaseKey"),
    )
    assert write.actions == (
        Put("leaseOwner", {"S": "b"}),
        Put("checkpointOwner", {"S": "a"}),
        Remove("shardflowHandoffRequest"),
    )


def test_complete_handoff_is_kcl_3_assign_to_the_next_owner() -> None:
    write = w.complete_handoff(HANDING_OFF, "a")
    assert write.conditions == (
        Equals("leaseOwner", {"S": "b"}),
        Equals("checkpointOwner", {"S": "a"}),
    )
    assert write.actions == (
        Put("leaseOwner", {"S": "b"}),
        Remove("checkpointOwner"),
        Add("leaseCounter", 1),
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: w.renew(HELD, ""),
        lambda: w.take(HELD, ""),
        lambda: w.release(HELD, ""),
        lambda: w.checkpoint(HELD, "", POSITION),
        lambda: w.handoff(HELD, "a", ""),
        lambda: w.handoff(HELD, "a", "a"),
        lambda: w.create(Lease("s", lease_owner="")),
        lambda: w.create(Lease("s", lease_owner="a", checkpoint_owner="")),
        lambda: w.complete_handoff(HELD, "a"),
        lambda: w.checkpoint(HELD, "a", ExtendedSequenceNumber("12abc")),
        lambda: w.checkpoint(HELD, "a", ExtendedSequenceNumber("12", -1)),
        lambda: w.checkpoint(HELD, "a", POSITION, pending_state=b"x"),
        lambda: w.update_children(HELD, []),
    ],
)
def test_calls_that_would_write_nonsense_are_refused(call: object) -> None:
    with pytest.raises(ValueError, match=r"worker|position|pending|handoff|set"):
        call()  # type: ignore[operator]


def test_an_attribute_is_never_changed_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        w.LeaseWrite("x", "k", "update", (), (Put("a", {"S": "1"}), Remove("a")))


def test_expressions_use_placeholders_for_every_name_and_value() -> None:
    params = render(w.take(HELD, "c").conditions, w.take(HELD, "c").actions)
    assert params["UpdateExpression"] == (
        "SET #a0 = :v0, #a1 = :v1 REMOVE #a2, #a3, #a4 ADD #a5 :v2"
    )
    assert params["ConditionExpression"] == "#a0 = :v3 AND #a1 = :v4"
    assert params["ExpressionAttributeNames"] == {
        "#a0": "leaseCounter",
        "#a1": "leaseOwner",
        "#a2": "checkpointOwner",
        "#a3": "shardflowHandoffRequest",
        "#a4": "shardflowLeaving",
        "#a5": "ownerSwitchesSinceCheckpoint",
    }
    assert params["ExpressionAttributeValues"] == {
        ":v0": {"N": "8"},
        ":v1": {"S": "c"},
        ":v2": {"N": "1"},
        ":v3": {"N": "7"},
        ":v4": {"S": "a"},
    }


def test_conditions_alone_render_without_update() -> None:
    params = render((Absent("leaseKey"),))
    assert params == {
        "ConditionExpression": "attribute_not_exists(#a0)",
        "ExpressionAttributeNames": {"#a0": "leaseKey"},
    }


def test_peers_notice_every_write_that_moves_a_lease_and_no_renewal() -> None:
    from shardflow.leases import entities as e

    noticed = [
        w.create(Lease.new("shardId-1")),
        w.take(HELD, "b"),
        w.release(HELD, "a"),
        w.checkpoint(HELD, "a", ExtendedSequenceNumber(SHARD_END)),
        w.update_children(HELD, ["shardId-2"]),
        w.delete(HELD),
        w.handoff(HELD, "a", "b"),
        w.complete_handoff(HANDING_OFF, "a"),
        w.request_handoff(HELD, "b"),
        e.register_heartbeat("a", None),
        e.fence(e.Heartbeat("a", 3), "b"),
        e.delete_heartbeat(e.Heartbeat("a", 3)),
    ]
    quiet = [
        w.renew(HELD, "a"),
        w.checkpoint(HELD, "a", POSITION),
        w.prepare_checkpoint(HELD, "a", POSITION),
        w.update_hash_range(HELD, HashKeyRange(0, 9)),
        e.beat(e.Heartbeat("a", 3)),
        e.note_change(),
    ]
    assert [x.operation for x in noticed if not w.noticed_by_peers(x)] == []
    assert [x.operation for x in quiet if w.noticed_by_peers(x)] == []


def test_the_change_marker_is_only_bumped_on_a_heartbeat_mode_item() -> None:
    from shardflow.leases import entities as e

    write = e.note_change()
    assert write.lease_key == e.MODE_KEY
    # Never creates the mode item: a table of leases only stays one (KCL 2.x).
    assert Equals("entityType", {"S": e.MODE_ENTITY}) in write.conditions
    assert Equals("leaseMode", {"S": "heartbeat"}) in write.conditions
    assert write.actions == (Add("changeCounter", 1),)
    setting = e.set_mode("heartbeat")
    assert setting.kind == "update"
    assert Add("changeCounter", 1) in setting.actions
