"""The chaos soak's checker (bench/chaos_check.py) finds each kind of failure in handler logs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from support.bench import load_bench

cc = load_bench("chaos_check")
SHARD = "shardId-000000000000"


def acked(key: str, seq: int, shard: str = SHARD) -> object:
    return cc.Acked(key, seq, shard, f"{1000 + seq}", 0, 0.0)


def call(
    worker: str,
    key: str,
    seq: int,
    start: float,
    end: float | None = None,
    shard: str = SHARD,
    outcome: str = "ok",
    number: str | None = None,
) -> object:
    stop = start + 0.01 if end is None else end
    return cc.Call(worker, shard, number or f"{1000 + seq}", 0, key, str(seq), start, stop, outcome)


def run(acks: list[object], calls: list[object], faults: list[object] | None = None) -> object:
    return cc.check(acks, [], 0, calls, Counter(), faults or [])


def test_a_clean_run_passes() -> None:
    acks = [acked("k", i) for i in range(3)]
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 1, 2.0), call("w2", "k", 2, 5.0)]
    report = run(acks, calls)
    assert report.passed
    assert (report.lost, report.handled, report.overlaps, report.duplicates) == (0, 3, 0, 0)


def test_a_record_never_handled_is_lost_and_its_shard_stuck() -> None:
    report = run([acked("k", 0), acked("k", 1)], [call("w1", "k", 0, 1.0)])
    assert report.lost == 1
    assert report.stuck_shards == [SHARD]
    assert not report.passed


def test_a_call_that_raised_does_not_count_as_handled() -> None:
    report = run([acked("k", 0)], [call("w1", "k", 0, 1.0, outcome="raised")])
    assert report.lost == 1


def test_poison_must_reach_the_dead_letters() -> None:
    poison = [("poison-1", "refused", SHARD)]
    lost = cc.check([], poison, 0, [], Counter(), [])
    kept = cc.check([], poison, 0, [], Counter({"poison-1": 2}), [])
    assert lost.lost == 1
    assert (kept.lost, kept.poison_dead_lettered, kept.dead_letters_repeated) == (0, 1, 1)


def test_a_record_started_before_its_predecessor_ended_breaks_key_order() -> None:
    acks = [acked("k", 0), acked("k", 1)]
    report = run(acks, [call("w1", "k", 0, 1.0, 1.5), call("w1", "k", 1, 1.2, 1.3)])
    assert report.order_violations == 1


def test_a_replay_after_failover_is_not_an_order_violation() -> None:
    acks = [acked("k", 0), acked("k", 1)]
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 1, 2.0), call("w2", "k", 0, 9.0)]
    report = run(acks, calls, [cc.Fault("kill", "w1", 3.0, 3.0)])
    assert report.order_violations == 0
    assert report.duplicates_by_cause == {"kill": 1}


def test_two_workers_in_one_shard_at_once_is_an_overlap() -> None:
    acks = [acked("a", 0), acked("b", 0)]
    report = run(acks, [call("w1", "a", 0, 1.0, 2.0), call("w2", "b", 0, 1.5, 1.6)])
    assert report.overlaps == 1
    assert not report.passed


def test_an_overlap_by_a_call_frozen_by_sigstop_is_attributed() -> None:
    acks = [acked("a", 0), acked("b", 0)]
    calls = [call("w1", "a", 0, 1.0, 20.0), call("w2", "b", 0, 10.0, 10.1)]
    report = run(acks, calls, [cc.Fault("stop", "w1", 1.005, 19.0)])
    assert (report.overlaps, report.overlaps_frozen) == (0, 1)


def test_a_call_begun_after_sigcont_is_not_excused() -> None:
    acks = [acked("a", 0), acked("b", 0)]
    calls = [call("w1", "a", 0, 19.5, 21.0), call("w2", "b", 0, 20.0, 20.1)]
    report = run(acks, calls, [cc.Fault("stop", "w1", 5.0, 19.0)])
    assert report.overlaps == 1


def test_workers_taking_turns_on_a_shard_are_interleaved() -> None:
    acks = [acked("k", i) for i in range(4)]
    calls = [
        call("w1", "k", 0, 1.0),
        call("w2", "k", 1, 1.5),
        call("w1", "k", 2, 2.0),
        call("w2", "k", 3, 2.5),
    ]
    report = run(acks, calls)
    assert report.overlaps == 0
    assert report.interleaved >= 1


def test_a_duplicate_without_a_fault_is_unexplained() -> None:
    report = run([acked("k", 0)], [call("w1", "k", 0, 1.0), call("w1", "k", 0, 3.0)])
    assert report.duplicates_by_cause == {"unexplained": 1}
    assert not report.passed


@pytest.mark.parametrize("kind", ["dynamodb_brownout"])
def test_a_duplicate_around_a_lease_table_brownout_is_attributed(kind: str) -> None:
    calls = [call("w1", "k", 0, 1.0), call("w2", "k", 0, 3.0)]
    report = run([acked("k", 0)], calls, [cc.Fault(kind, "", 0.5, 2.5)])
    assert report.duplicates_by_cause == {kind: 1}


def unguarded(calls: list[object], faults: list[object], events: list[object]) -> object:
    """A run without the idempotency guard, whose workers logged their checkpoints."""
    return cc.check(
        [acked("k", 0)], [], 0, calls, Counter(), faults, lease_events=events, guarded=False
    )


def test_without_the_guard_a_replay_of_a_record_no_checkpoint_covered_is_the_brownouts() -> None:
    # Handled 4.1 s before the brownout; the checkpoint due 2 s later was late (a loaded
    # machine) and then refused: the next owner began before the record.
    calls = [call("w1", "k", 0, 10.0), call("w2", "k", 0, 20.0)]
    brownout = cc.Fault("dynamodb_brownout", "", 14.1, 18.0)
    written = [cc.LeaseEvent("w1", "CheckpointWritten", SHARD, 9.0, "999:0")]
    report = unguarded(calls, [brownout], written)
    assert report.duplicates_by_cause == {"dynamodb_brownout": 1}
    # With the guard the same duplicate stays unexplained (its completion was not refused).
    assert run([acked("k", 0)], calls, [brownout]).duplicates_by_cause == {"unexplained": 1}


def test_without_the_guard_a_replay_of_a_checkpointed_record_is_never_the_brownouts() -> None:
    calls = [call("w1", "k", 0, 10.0), call("w2", "k", 0, 20.0)]
    brownout = cc.Fault("dynamodb_brownout", "", 14.1, 18.0)
    for detail, at in (("1000:0", 12.0), ("SHARD_END:0", 12.0), ("1000:0", 15.0)):
        written = [cc.LeaseEvent("w1", "CheckpointWritten", SHARD, at, detail)]
        report = unguarded(calls, [brownout], written)
        assert report.duplicates_by_cause == {"unexplained": 1}, (detail, at)


@pytest.mark.parametrize(
    ("lapse", "cause"),
    [
        ("2.500/-", "slow_lease_table"),  # a renewal unanswered for 2.5 s at the deadline
        ("-/AwsError", "slow_lease_table"),  # the last renewal failed
        ("0.200/-", "unexplained"),  # sent late: the table answered in time
        ("-/-", "unexplained"),  # no write tried: the worker's own doing
    ],
)
def test_a_replay_after_a_lease_lapsed_on_a_slow_table_is_attributed_only_with_evidence(
    lapse: str, cause: str
) -> None:
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 0, 9.0)]
    events = [
        cc.LeaseEvent("w1", "LeaseAcquired", SHARD, 0.5, "free"),
        cc.LeaseEvent("w1", "LeaseLost", SHARD, 7.0, "expired", lapse),
        cc.LeaseEvent("w1", "LeaseAcquired", SHARD, 8.0, "resumed"),
    ]
    report = cc.check([acked("k", 0)], [], 0, calls, Counter(), [], lease_events=events)
    assert report.duplicates_by_cause == {cause: 1}
    assert report.passed == (cause != "unexplained")
    # A lapse before the first call, or on another shard, explains nothing.
    early = [events[0], cc.LeaseEvent("w1", "LeaseLost", SHARD, 0.8, "expired", lapse)]
    report = cc.check([acked("k", 0)], [], 0, calls, Counter(), [], lease_events=early)
    assert report.duplicates_by_cause == {"unexplained": 1}


def test_a_lapse_line_of_a_worker_log_is_read_back(tmp_path: Path) -> None:
    log = tmp_path / "w1.0.tsv"
    log.write_text(f"L\tw1.0\tLeaseLost\t{SHARD}\t7.000000\texpired\t3.100/-\n")
    (event,) = cc.read_lease_events([log])
    assert event.lapse == "3.100/-"
    assert event.slow_table(1.0)
    assert not event.slow_table(5.0)


def test_the_same_record_written_twice_is_a_producer_copy() -> None:
    acks = [acked("k", 0), cc.Acked("k", 0, SHARD, "2000", 0, 0.0)]
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 0, 2.0, number="2000")]
    report = run(acks, calls)
    assert report.copies == 1
    assert report.duplicates_by_cause == {"producer copy": 1}


def test_logs_are_read_back_with_cut_calls_and_torn_lines(tmp_path: Path) -> None:
    log = tmp_path / "w1.0.tsv"
    log.write_text(
        f"S\tw1.0\t{SHARD}\t1000\t0\tk\t0\t1.0\n"
        f"E\tw1.0\t{SHARD}\t1000\t0\tk\t0\t1.1\tok\n"
        f"S\tw1.0\t{SHARD}\t1001\t0\tk\t1\t2.0\n"
        f"E\tw1.0\t{SHARD}\t1001\t0\tk"  # killed mid-write: no newline
    )
    calls = cc.read_calls([log])
    assert [(c.seq, c.outcome) for c in calls] == [("0", "ok"), ("1", "cut")]


def test_a_kill_long_after_the_call_does_not_explain_a_duplicate() -> None:
    # The record was handled (and marked) 20 s before the kill: a second call is a bug.
    calls = [call("w1", "k", 0, 1.0), call("w2", "k", 0, 30.0)]
    report = run([acked("k", 0)], calls, [cc.Fault("kill", "w1", 21.0, 21.0)])
    assert report.duplicates_by_cause == {"unexplained": 1}


def test_a_call_after_a_brownout_ended_is_not_excused_by_it() -> None:
    # The k043:17 case of a run: the same worker ran a record twice, 5 s after a brownout.
    calls = [call("w1", "k", 0, 12.0), call("w1", "k", 0, 27.0)]
    report = run([acked("k", 0)], calls, [cc.Fault("dynamodb_brownout", "", 0.0, 7.0)])
    assert report.duplicates_by_cause == {"unexplained": 1}


# --- the checkers of issue 22: each fed the violation it exists to catch ---------------------

OTHER = "shardId-000000000001"


def lease(worker: str, event: str, at: float, detail: str = "", shard: str = SHARD) -> object:
    return cc.LeaseEvent(worker, event, shard, at, detail)


def test_a_lease_taken_while_its_owner_still_held_it_is_two_owners() -> None:
    events = [
        lease("w1", "LeaseAcquired", 1.0, "free"),
        lease("w2", "LeaseAcquired", 5.0, "expired"),  # w1 never lost it: it was alive
        lease("w1", "LeaseLost", 8.0, "taken"),
    ]
    report = cc.check([], [], 0, [], Counter(), [], lease_events=events)
    assert report.double_owners == 1
    assert "double_owners" in report.failures


def test_lease_ownership_passing_cleanly_is_no_double_owner() -> None:
    events = [
        lease("w1", "LeaseAcquired", 1.0, "free"),
        lease("w1", "LeaseLost", 4.0, "expired"),
        lease("w2", "LeaseAcquired", 5.0, "expired"),
        # a handoff: w1 hears of it at its next renewal, a moment later
        lease("w1", "LeaseAcquired", 9.0, "handoff", shard=OTHER),
        lease("w3", "LeaseAcquired", 10.0, "handoff", shard=OTHER),
        lease("w1", "LeaseLost", 10.5, "handoff", shard=OTHER),
    ]
    report = cc.check([], [], 0, [], Counter(), [], lease_events=events)
    assert (report.double_owners, report.handovers) == (0, 1)


def test_a_killed_or_frozen_owner_is_not_a_live_owner() -> None:
    events = [
        lease("w1", "LeaseAcquired", 1.0, "free"),
        lease("w2", "LeaseAcquired", 1.0, "free", shard=OTHER),
        lease("w3", "LeaseAcquired", 9.0, "expired"),
        lease("w3", "LeaseAcquired", 9.0, "expired", shard=OTHER),
        lease("w2", "LeaseLost", 12.5, "expired", shard=OTHER),  # after SIGCONT at 12
    ]
    faults = [cc.Fault("kill", "w1", 2.0, 2.0), cc.Fault("stop", "w2", 2.0, 12.0)]
    report = cc.check([], [], 0, [], Counter(), faults, lease_events=events)
    assert report.double_owners == 0
    assert report.stale_after_stop == [0.5]


def test_a_record_sent_but_never_answered_is_unreconciled() -> None:
    sent = cc.Sent(
        sent=frozenset({("k", 0), ("k", 1), ("k", 2)}),
        acked=frozenset({("k", 0)}),
        failed=frozenset({("k", 1)}),
    )
    report = cc.check([acked("k", 0)], [], 1, [call("w1", "k", 0, 1.0)], Counter(), [], sent=sent)
    assert (report.sent, report.unreconciled) == (3, 1)
    assert "unreconciled" in report.failures
    balanced = cc.Sent(sent.sent, sent.acked | {("k", 2)}, sent.failed)
    assert cc.check([], [], 0, [], Counter(), [], sent=balanced).unreconciled == 0


def test_a_shard_that_never_handles_again_after_a_fault_is_stalled() -> None:
    acks = [acked("k", 0), cc.Acked("k", 1, SHARD, "1001", 0, 20.0)]
    calls = [call("w1", "k", 0, 1.0)]  # nothing after the brownout: k:1 waits forever
    faults = [cc.Fault("kinesis_brownout", "", 5.0, 15.0, injected=40)]
    report = cc.check(acks, [], 0, calls, Counter(), faults, failover=6.0)
    assert report.stalled == [f"kinesis_brownout@15.0:{SHARD}"]
    assert "stalled" in report.failures


def test_a_shard_slower_than_the_goal_after_a_fault_misses_it() -> None:
    acks = [acked("k", 0, shard=OTHER), cc.Acked("k", 1, SHARD, "1001", 0, 9.0)]
    calls = [call("w1", "k", 0, 10.5, shard=OTHER), call("w2", "k", 1, 30.0)]
    faults = [cc.Fault("kill", "w9", 10.0, 10.0)]
    report = cc.check(acks, [], 0, calls, Counter(), faults, failover=6.0)
    [progress] = report.progress
    assert (progress["p50"], progress["max"]) == (10.25, 20.0)
    assert (report.progress_max, report.progress_goal) == (20.0, 11.0)
    assert report.progress_goal_met is False
    assert report.as_dict()["progress_goal_met"] is False


def test_a_proxy_fault_that_failed_no_request_is_silent() -> None:
    faults = [
        cc.Fault("dynamodb_brownout", "", 1.0, 5.0, injected=0),
        cc.Fault("throttle", "", 6.0, 8.0, injected=12),
    ]
    report = cc.check([], [], 0, [], Counter(), faults)
    assert report.silent_faults == ["dynamodb_brownout at 1.000 failed 0 requests"]
    assert "silent_faults" in report.failures


def test_a_kill_between_calls_interrupted_nothing_and_fails_the_run() -> None:
    cut = cc.Call("w2", SHARD, "1001", 0, "k", "1", 1.5, None, "cut")  # never ended: killed
    calls = [call("w1", "k", 0, 1.0, 1.1), cut]
    faults = [cc.Fault("kill", "w1", 2.0, 2.0, pid=11), cc.Fault("kill", "w2", 2.0, 2.0, pid=12)]
    report = cc.check([], [], 0, calls, Counter(), faults)
    assert [p["interrupted"] for p in report.per_fault] == [0, 1]
    assert [p["pid"] for p in report.per_fault] == [11, 12]
    assert report.uninterrupting == ["kill w1 at 2.000 interrupted 0 calls"]


def test_sigstop_and_brownout_count_the_calls_they_caught() -> None:
    calls = [
        call("w1", "a", 0, 1.0, 9.0),  # frozen mid-call
        call("w2", "b", 0, 1.5, 1.7),  # in flight when the brownout began
        call("w2", "b", 1, 3.0, 3.1),  # after both began: hit by neither
    ]
    faults = [
        cc.Fault("stop", "w1", 1.2, 8.9),
        cc.Fault("dynamodb_brownout", "", 1.6, 4.0, injected=3),
    ]
    report = cc.check([], [], 0, calls, Counter(), faults)
    assert report.interrupted_by_kind == {"stop": 1, "dynamodb_brownout": 2}
    assert report.uninterrupting == []


def test_a_frozen_call_reports_how_long_it_outlived_its_lease() -> None:
    calls = [call("w1", "a", 0, 1.0, 20.0), call("w2", "b", 0, 10.0, 10.1)]
    events = [
        lease("w1", "LeaseAcquired", 0.5, "free"),
        lease("w2", "LeaseAcquired", 9.0, "expired"),
        lease("w1", "LeaseLost", 20.5, "expired"),
    ]
    faults = [cc.Fault("stop", "w1", 1.005, 19.0)]
    report = cc.check([], [], 0, calls, Counter(), faults, lease_events=events)
    assert report.frozen_calls == [
        {
            "worker": "w1",
            "shard": SHARD,
            "record": "a:0",
            "frozen_for": 19.0,
            "outlived_lease": 11.0,
        }
    ]


def test_caught_up_is_timed_from_the_last_faults_end() -> None:
    acks = [cc.Acked("k", i, SHARD, f"{1000 + i}", 0, float(i)) for i in range(4)]
    calls = [call("w1", "k", i, 10.0 + i, 10.5 + i) for i in range(4)]
    faults = [cc.Fault("throttle", "", 0.0, 2.5, injected=1)]
    report = cc.check(acks, [], 0, calls, Counter(), faults)
    # k:0..k:2 were acknowledged before 2.5; the last of them was handled at 12.5
    assert (report.last_fault_end, report.caught_up_after) == (2.5, 10.0)
    assert report.latency_after_faults == {"records": 1, "p50": 10.5, "p99": 10.5, "max": 10.5}
    lost = cc.check(acks, [], 0, calls[:2], Counter(), faults)
    assert lost.caught_up_after is None


def test_logs_with_pids_proxy_counts_and_lease_details_are_read_back(tmp_path: Path) -> None:
    faults = tmp_path / "faults.tsv"
    faults.write_text(
        "kill\tw1.0\t1.0\t1.0\t4242\t\nthrottle\t\t2.0\t5.0\t\t17\nsplit\ts\t6.0\t6.0\n"
    )
    assert cc.read_faults(faults) == [
        cc.Fault("kill", "w1.0", 1.0, 1.0, 4242, None),
        cc.Fault("throttle", "", 2.0, 5.0, None, 17),
        cc.Fault("split", "s", 6.0, 6.0),
    ]
    log = tmp_path / "w1.0.tsv"
    log.write_text(
        "L\tw1.0\tStarted\t\t0.5\t4242\n"
        f"L\tw1.0\tLeaseAcquired\t{SHARD}\t1.0\texpired\n"
        f"L\tw1.0\tLeaseLost\t{SHARD}\t2.0"  # torn
    )
    assert cc.read_lease_events([log]) == [
        cc.LeaseEvent("w1.0", "Started", "", 0.5, "4242"),
        cc.LeaseEvent("w1.0", "LeaseAcquired", SHARD, 1.0, "expired"),
    ]
    produced = tmp_path / "produced.tsv"
    produced.write_text("W\tk\t0\t1.0\nW\tk\t1\t1.0\nA\tk\t0\ts\t1\t0\t2.0\nF\tk\t1\tX\t3.0\n")
    sent = cc.read_sent(produced)
    assert (len(sent.sent), len(sent.acked), len(sent.failed)) == (2, 1, 1)


def test_a_shard_whose_last_records_were_in_flight_across_the_fault_progressed() -> None:
    # A merge parent: its last record's call began 2 ms before the merge and ended after it;
    # the shard then closed, so no call starts after the fault, and it is not stalled.
    acks = [acked("k", 0), cc.Acked("k", 1, SHARD, "1001", 0, 9.0)]
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 1, 9.998, end=10.05)]
    faults = [cc.Fault("merge", "", 10.0, 10.0)]
    report = cc.check(acks, [], 0, calls, Counter(), faults, failover=6.0)
    assert report.stalled == []
    [progress] = report.progress
    assert progress["max"] == pytest.approx(0.05)


def test_a_call_in_flight_across_the_fault_does_not_excuse_records_left_waiting() -> None:
    # The in-flight call finished k:1, but k:2 waits and no call ever starts again: stalled.
    acks = [acked("k", 0), cc.Acked("k", 1, SHARD, "1001", 0, 9.0)]
    acks.append(cc.Acked("k", 2, SHARD, "1002", 0, 9.5))
    calls = [call("w1", "k", 0, 1.0), call("w1", "k", 1, 9.998, end=10.05)]
    faults = [cc.Fault("merge", "", 10.0, 10.0)]
    report = cc.check(acks, [], 0, calls, Counter(), faults, failover=6.0)
    assert report.stalled == [f"merge@10.0:{SHARD}"]
