"""bench/fleet_timeline.py: a planned move's pause split into its logged steps."""

from __future__ import annotations

from pathlib import Path

from support.bench import load_bench

timeline = load_bench("fleet_timeline")

SHARD = "shardId-000000000007"


def write_logs(tmp_path: Path) -> dict[str, Path]:
    old = tmp_path / "w01.log"
    new = tmp_path / "w02.log"
    old.write_text(
        f"100.100 shardflow.leases handing lease {SHARD} over to w02\n"
        "100.105 shardflow.leases handing lease shardId-000000000008 over to w02\n"
        f"100.300 shardflow.leases lease {SHARD} handed over to w02 at checkpoint 4967\n"
        "100.301 shardflow.consumer a line of no interest\n"
    )
    new.write_text(
        f"100.700 shardflow.leases claimed lease {SHARD} (handoff)\n"
        f"100.750 shardflow.consumer shard {SHARD} (stream s): resuming after checkpoint 4967 "
        "(records up to it and including it are not handled again)\n"
    )
    return {"w01": old, "w02": new}


def test_a_moves_pause_is_the_sum_of_its_stages(tmp_path: Path) -> None:
    events = timeline.read_events(write_logs(tmp_path))
    rows = [
        ("w01", SHARD, "a", 99.5),
        ("w01", SHARD, "b", 100.0),
        ("w02", SHARD, "c", 100.9),
        ("w02", SHARD, "d", 101.4),
    ]
    written = {"a": 99.45, "b": 99.95, "c": 100.8, "d": 101.3}
    (move,) = timeline.moves(rows, events, 100.5, 102.0, written)
    assert (move.old, move.new) == ("w01", "w02")
    stages = move.stages()
    assert stages == {
        "begun": 0.1,
        "handed": 0.2,
        "claimed": 0.4,
        "reader": 0.05,
        "no_record": 0.05,  # the reader was up at 100.75; record c was written at 100.8
        "first": 0.1,
    }
    assert round(sum(v for v in stages.values() if v is not None), 3) == round(move.gap, 3)
    assert round(move.first_delay, 3) == 0.1

    summary = timeline.stage_summary([move])
    assert summary["moves"] == 1
    assert summary["stages"]["claimed"] == {"median": 0.4, "max": 0.4, "logged": 1}
    assert summary["worst"][0]["shard"] == SHARD
    assert "handed over -> claimed by the new owner 0.400" in timeline.describe(summary)[0]


def test_moves_outside_the_window_and_points_of_other_workers_are_left_out(
    tmp_path: Path,
) -> None:
    events = timeline.read_events(write_logs(tmp_path))
    rows = [("w01", SHARD, "a", 100.0), ("w03", SHARD, "b", 100.9)]
    (move,) = timeline.moves(rows, events, 100.5, 102.0)
    # w03 took the shard: w02's claim and reader are not this move's points.
    assert (move.claimed, move.reader) == (None, None)
    assert move.begun == 100.1
    assert timeline.moves(rows, events, 101.0, 102.0) == []


def test_a_pause_of_a_shard_that_stayed_is_set_against_the_producer_and_the_loop(
    tmp_path: Path,
) -> None:
    log = tmp_path / "w01.log"
    log.write_text(
        "101.900 bench.loop loop late by 0.400 s (asked at 101.500)\n"
        "105.000 bench.loop loop late by 0.900 s (asked at 104.000)\n"  # after the pauses
    )
    late = timeline.read_loop_late({"w01": log, "w09": tmp_path / "gone.log"})
    assert late == {"w01": [(101.5, 0.4), (104.0, 0.9)]}
    rows = [
        ("w01", SHARD, "a", 100.0),
        ("w01", SHARD, "b", 101.2),  # the producer wrote b 1.1 s after a: its own gap
        ("w01", SHARD, "c", 102.4),  # written 0.5 s after b: a pause of the worker's
        ("w01", SHARD, "d", 102.9),
        ("w02", "shardId-000000000008", "e", 100.0),
        ("w03", "shardId-000000000008", "f", 101.5),  # moved: not a stay
    ]
    written = {"a": 99.9, "b": 101.0, "c": 101.5, "d": 102.0, "e": 99.9, "f": 100.4}
    found = timeline.stays(rows, 100.5, 103.0, 0.75, written, late, [(100.5, 0.6)])
    assert [(round(s.gap, 3), s.writer_gap, s.loop_late, s.slow_put) for s in found] == [
        (1.2, 1.1, 0.0, 0.6),
        (1.2, 0.5, 0.4, 0.0),
    ]
    summary = timeline.stay_summary(found)
    assert summary["pauses"] == 2
    assert summary["writer_explains"] == 1
    assert summary["loop_late"] == 1
    assert summary["beyond_writer_max"] == 0.7
    assert summary["worst"][0]["beyond_writer"] == 0.7
    lines = timeline.describe_stays(summary, 0.75)
    assert "the producer's own gap within 0.25 s in 1, the worker's loop late in 1" in lines[0]
    assert timeline.describe_stays(timeline.stay_summary([]), 0.75) == [
        "no shard that stayed paused over 0.75 s"
    ]


def test_both_benches_explain_a_window_the_same_way(tmp_path: Path) -> None:
    # fleet.py and handoff.py both call explain: the moves of write_logs and a stay whose
    # worker's loop ran late, in one summary each, with the threshold the rate gives.
    logs = write_logs(tmp_path)
    logs["w02"].write_text(
        logs["w02"].read_text() + "102.300 bench.loop loop late by 0.500 s (asked at 101.800)\n"
    )
    rows = [
        ("w01", SHARD, "a", 99.5),
        ("w01", SHARD, "b", 100.0),
        ("w02", SHARD, "c", 100.9),
        ("w02", "shardId-000000000009", "x", 101.5),
        ("w02", "shardId-000000000009", "y", 102.3),  # written 0.2 s apart: paused 0.8 s
    ]
    written = {"a": 99.45, "b": 99.95, "c": 100.8, "x": 101.45, "y": 101.65}
    assert timeline.stay_pause(2.0) == 0.75
    assert timeline.stay_pause(5.0) == 0.45
    got = timeline.explain(rows, logs, 100.5, 103.0, written, [], timeline.stay_pause(5.0))
    assert got["handoffs"]["moves"] == 1
    assert got["handoffs"]["stages"]["claimed"]["median"] == 0.4
    assert got["stays"]["pauses"] == 1
    assert got["stays"]["loop_late"] == 1
    assert got["stays"]["longer_than"] == 0.45
    line = timeline.handoff_line(got["handoffs"])
    assert line.startswith("1 moves, median gap 0.90 s")
    assert f"slowest, {SHARD} w01 -> w02: gap 0.90 s = begun 0.10 s" in line


def test_the_handover_and_claim_writes_are_told_apart_from_drain_and_pickup(
    tmp_path: Path,
) -> None:
    old = tmp_path / "w01.log"
    new = tmp_path / "w02.log"
    old.write_text(
        f"100.100 shardflow.leases handing lease {SHARD} over to w02\n"
        f"100.300 shardflow.leases lease {SHARD} handed over to w02 at checkpoint 4967 "
        "(write 0.150 s)\n"
    )
    new.write_text(f"100.700 shardflow.leases claimed lease {SHARD} (handoff; write 0.250 s)\n")
    events = timeline.read_events({"w01": old, "w02": new})
    rows = [("w01", SHARD, "b", 100.0), ("w02", SHARD, "c", 100.9)]
    (move,) = timeline.moves(rows, events, 100.5, 102.0)
    assert (move.claimed, move.handover_write, move.claim_write) == (100.7, 0.15, 0.25)
    summary = timeline.stage_summary([move])
    assert summary["writes"] == {
        "handover": {"median": 0.15, "max": 0.15},
        "claim": {"median": 0.25, "max": 0.25},
    }
    assert (
        "of which the handover write 0.150 (max 0.150) and the claim write 0.250"
        in (timeline.describe(summary)[0])
    )
    assert "handover write 0.150, claim write 0.250" in timeline.describe(summary)[1]
    assert "of which the handover write 0.15 s" in timeline.handoff_line(summary)
