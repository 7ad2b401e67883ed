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
