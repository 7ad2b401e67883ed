"""The Spark chaos soak's checker (bench/chaos_spark_check.py) finds each failure it exists for:
fed a run with one planted violation, it reports it and fails the run."""

from __future__ import annotations

from collections import Counter
from typing import Any

from support.bench import load_bench

cc = load_bench("chaos_spark_check")
BOUND = 60.0


def batch(query: str, n: int, started: float, committed: float | None, *reads: str) -> Any:
    return cc.Batch(query, n, started, committed, reads or ("s0",))


def steady(until: float = 100.0, every: float = 5.0) -> list[Any]:
    """Both queries committing a 2-s batch every ``every`` seconds."""
    out = []
    n, moment = 0, 0.0
    while moment < until:
        out += [batch("events", n, moment, moment + 2), batch("alerts", n, moment, moment + 2)]
        n += 1
        moment += every
    return out


def run(**changes: Any) -> Any:
    arguments: dict[str, Any] = {
        "acked": ["e1", "e2", "e3"],
        "sink": Counter({"e1": 1, "e2": 1, "e3": 1}),
        "expected_alerts": ["o1"],
        "alert_copies": [("o1", 10.0)],
        "faults": [cc.Fault("kinesis_brownout", 20.0, 30.0, injected=7)],
        "batches": steady(),
        "tasks": [],
        "drivers": [cc.DriverRun(1, 0.0, 110.0, "stopped")],
        "batch_bound": BOUND,
        "until": 110.0,
    }
    arguments.update(changes)
    return cc.check(**arguments)


def test_a_clean_run_passes() -> None:
    report = run()
    assert report.passed, report.failures
    assert (report.lost, report.duplicated, report.alerts_missing) == (0, 0, 0)
    outcome = report.per_fault[0]
    assert outcome.batches_in_flight == 6  # those planned at 20, 25 and 30 s, of each query
    assert outcome.recovery == 2.0  # the batches planned at 30 s commit at 32 s


def test_an_acknowledged_event_missing_from_the_sink_is_lost() -> None:
    report = run(sink=Counter({"e1": 1, "e3": 1}))
    assert report.lost == 1
    assert report.examples["lost"] == ["e2"]
    assert not report.passed


def test_an_event_twice_in_the_file_sink_fails_the_run() -> None:
    report = run(sink=Counter({"e1": 1, "e2": 2, "e3": 1}))
    assert report.duplicated == 1
    assert not report.passed


def test_an_event_in_the_sink_that_was_never_sent_fails_but_one_given_up_on_does_not() -> None:
    sink = Counter({"e1": 1, "e2": 1, "e3": 1, "e4": 1})
    assert run(sink=sink).unexpected == 1
    assert run(sink=sink, sent=["e1", "e2", "e3", "e4"]).passed


def test_a_missing_alert_fails_the_run() -> None:
    report = run(expected_alerts=["o1", "o2"])
    assert report.alerts_missing == 1
    assert not report.passed


def test_a_duplicate_alert_inside_a_fault_window_is_explained() -> None:
    report = run(alert_copies=[("o1", 10.0), ("o1", 35.0)])
    assert report.alert_duplicates == 1
    assert report.alert_duplicates_by_cause == {"kinesis_brownout": 1}
    assert report.passed


def test_a_duplicate_alert_far_from_any_fault_is_unexplained() -> None:
    # 30 s (the fault's end) + BOUND = 90 s: a copy arriving later has no fault to blame.
    report = run(alert_copies=[("o1", 10.0), ("o1", 95.0)])
    assert report.alert_duplicates_by_cause == {"unexplained": 1}
    assert not report.passed


def test_a_micro_batch_longer_than_the_bound_is_stuck() -> None:
    batches = [*steady(), batch("events", 99, 40.0, 40.0 + BOUND + 5)]
    report = run(batches=batches, until=120.0)
    assert report.stuck == ["events batch 99: 65.0 s (committed)"]
    assert not report.passed


def test_the_queries_start_up_is_not_held_to_the_batch_bound() -> None:
    # make test on a loaded machine: the alerts query's first batch took 68.3 s (executors'
    # JVMs, then their first Python workers); the soak saw the queries running only after it.
    first = batch("alerts", 99, 0.0, BOUND + 8.0)
    started = run(batches=[*steady(), first], running_since=BOUND + 9.0)
    assert started.stuck == []
    later = run(batches=[*steady(), first], running_since=5.0)
    assert later.stuck == ["alerts batch 99: 68.0 s (committed)"]


def test_a_batch_never_committed_is_stuck_once_the_bound_passed() -> None:
    report = run(batches=[*steady(), batch("alerts", 99, 40.0, None)], until=110.0)
    assert report.stuck == ["alerts batch 99: 70.0 s (never committed)"]


def killed_at_45(ended: float) -> tuple[list[Any], list[Any], list[Any]]:
    """A driver killed at 45 s mid-batch (the batch planned at 40 s, committed by the next
    driver at 130 s); the next driver started at once, its queries at 100 s."""
    drivers = [
        cc.DriverRun(1, 0.0, 45.0, "killed", ready=1.0),
        cc.DriverRun(2, 45.1, ended, "stopped", ready=100.0),
    ]
    faults = [cc.Fault("driver_kill", 45.0, 45.0, "1")]
    return drivers, faults, [*steady(), batch("events", 99, 40.0, 130.0)]


def test_time_without_a_driver_does_not_count_against_a_batch() -> None:
    # The batch planned at 40 s is committed by the next driver at 130 s; that driver started
    # at once, its queries at 100 s: none ran from 45 s to 100 s, so the batch ran 35 s.
    drivers, faults, batches = killed_at_45(ended=140.0)
    report = run(batches=batches, drivers=drivers, faults=faults, until=140.0)
    assert report.stuck == []
    assert report.longest_batch == 35.0


def test_a_new_drivers_wait_for_its_first_executor_does_not_count_against_a_batch() -> None:
    # As above, but the new driver's first task ran at 120 s (its executors are new JVMs on a
    # busy machine): no batch could run from 100 s to 120 s either, so the batch ran 15 s.
    drivers, faults, batches = killed_at_45(ended=190.0)
    tasks = [cc.Task(0, 2.0, 3.0, "Success"), cc.Task(1, 120.0, 121.0, "Success")]
    report = run(batches=batches, drivers=drivers, faults=faults, tasks=tasks, until=190.0)
    assert report.longest_batch == 15.0
    without = run(batches=batches, drivers=drivers, faults=faults, until=190.0)
    assert without.longest_batch == 35.0


def test_a_duplicate_alert_before_a_slow_recovery_is_the_faults() -> None:
    # The driver killed at 45 s; the next one re-runs the caught batches and commits one
    # planned after the kill only at 160 s (recovery 115 s): a copy at 150 s is the kill's,
    # one at 230 s (past recovery + BOUND) is not.
    faults = [cc.Fault("driver_kill", 45.0, 45.0, "1")]
    batches = [*steady(40.0), *(batch(q, 50, 155.0, 160.0) for q in ("events", "alerts"))]
    drivers = [cc.DriverRun(1, 0.0, 45.0, "killed"), cc.DriverRun(2, 45.1, 250.0, "stopped")]
    copies = [("o1", 10.0), ("o1", 150.0)]
    common: dict[str, Any] = {"faults": faults, "batches": batches, "drivers": drivers}
    report = run(alert_copies=copies, until=250.0, **common)
    assert report.per_fault[0].recovery == 115.0
    assert report.alert_duplicates_by_cause == {"driver_kill": 1}
    late = run(alert_copies=[*copies, ("o1", 230.0)], until=250.0, **common)
    assert late.alert_duplicates_by_cause == {"driver_kill": 1, "unexplained": 1}


def test_a_proxy_fault_that_failed_no_request_is_silent() -> None:
    report = run(faults=[cc.Fault("s3_brownout", 20.0, 30.0, injected=0)])
    assert report.silent_faults == ["s3_brownout at 20.0: the proxy failed no request"]
    assert not report.passed


def test_a_kill_with_no_batch_in_flight_tested_nothing() -> None:
    # Batches run 0-2, 5-7, ...: a kill at 3.0 lands between two of them.
    report = run(faults=[cc.Fault("executor_kill", 3.0, 3.0, "4242")])
    assert report.uninterrupting == ["executor_kill at 3.0: no micro-batch in flight"]
    assert not report.passed


def test_a_fault_after_which_a_query_never_commits_again_is_a_stall() -> None:
    batches = [b for b in steady() if b.query == "events" or b.started < 30.0]
    report = run(batches=batches)
    assert report.per_fault[0].recovery_by_query["alerts"] is None
    assert report.stalled == [
        "kinesis_brownout at 20.0: a query committed nothing planned after it"
    ]
    assert not report.passed


def test_a_split_recovers_only_when_a_batch_reads_a_new_shard() -> None:
    batches = [
        *steady(),
        batch("events", 50, 52.0, 53.0, "s1"),
        batch("alerts", 50, 60.0, 64.0, "s1"),
    ]
    report = run(
        faults=[cc.Fault("split", 40.0, 41.0, "s0", new_shards=("s1", "s2"))], batches=batches
    )
    assert report.per_fault[0].recovery_by_query == {"alerts": 23.0, "events": 12.0}
    assert report.per_fault[0].recovery == 23.0


def test_failed_tasks_and_tasks_lost_with_a_killed_driver_are_counted() -> None:
    drivers = [cc.DriverRun(7, 0.0, 45.0, "killed"), cc.DriverRun(8, 50.0, 110.0, "stopped")]
    tasks = [
        cc.Task(0, 10.0, 12.0, "Success"),
        cc.Task(0, 20.0, 21.0, "ExecutorLostFailure"),
        cc.Task(0, 44.0, None, None),  # running when driver 7 died
        cc.Task(1, 60.0, 61.0, "Success"),
    ]
    faults = [cc.Fault("executor_kill", 21.0, 21.0, "99"), cc.Fault("driver_kill", 45.0, 45.0, "7")]
    batches = [*steady(), batch("events", 98, 44.0, 52.0), batch("alerts", 98, 44.0, 52.0)]
    report = run(tasks=tasks, drivers=drivers, faults=faults, batches=batches)
    executor, driver = report.per_fault
    assert (executor.tasks_failed, executor.tasks_lost_with_driver) == (1, 0)
    assert driver.tasks_lost_with_driver == 1


def test_a_task_failure_counts_for_one_fault_only() -> None:
    # A brownout from 20 to 30 s, a kill at 40 s: the failure at 45 s is the kill's.
    faults = [
        cc.Fault("kinesis_brownout", 20.0, 30.0, injected=5),
        cc.Fault("executor_kill", 40.0, 40.0, "99"),
    ]
    tasks = [
        cc.Task(0, 25.0, 29.0, "ExceptionFailure"),
        cc.Task(0, 39.0, 45.0, "ExecutorLostFailure"),
    ]
    batches = [*steady(), batch("events", 98, 39.0, 47.0)]
    brownout, kill = run(faults=faults, tasks=tasks, batches=batches).per_fault
    assert (brownout.tasks_failed, kill.tasks_failed) == (1, 1)
