"""bench/handoff.py and bench/fleet.py ``--repeat``: rounds combined into medians, records
twice and lost summed, goals judged on what the table shows."""

from __future__ import annotations

from typing import Any

from support.bench import load_bench

handoff = load_bench("handoff")
fleet = load_bench("fleet")


def outcome(gap_max: float, duplicates: int = 0, takeover: float | None = None) -> Any:
    return handoff.Outcome(
        "a",
        "handoff",
        gap_p99=gap_max / 2,
        gap_p99_median=gap_max / 4,
        gap_max=gap_max,
        duplicates=duplicates,
        written=100,
        takeover=takeover,
        handoffs={"moves": int(gap_max * 10)},
    )


def test_handoff_rounds_give_medians_and_sums() -> None:
    rounds = [[outcome(1.3, 0, 5.0)], [outcome(0.7, 2, 6.0)], [outcome(0.9, 0, 5.5)]]
    (got,) = handoff.combine(rounds)
    assert got.gap_max == 0.9
    assert got.gap_p99 == 0.45
    assert got.duplicates == 2  # one round's duplicates are not a median's to hide
    assert got.written == 300
    assert got.takeover == 5.5
    assert got.handoffs == {"moves": 9}  # the median round's steps
    assert [r["gap_max"] for r in got.rounds] == [1.3, 0.7, 0.9]
    assert handoff.targets([got]) == ["(a) MISSED"]  # 2 twice in all
    notes = handoff.rounds_notes([got])
    assert notes[0].startswith("medians of 3 rounds")
    assert "longest gap per round 1.30 / 0.70 / 0.90 s" in notes[1]
    assert handoff.combine([[outcome(1.3)]])[0].rounds == []  # one round: as it is


def fleet_result(gap: float, delay: float, twice: int, balanced_ok: bool) -> dict[str, Any]:
    planned = {
        "name": "rolling",
        "title": "rolling restart",
        "judged": "planned",
        "figures": {"gap_max": gap, "delay_p99": delay, "twice": twice, "lost": 0},
        "per_shard": {"s": {"gap_max": gap}},
        "goals": {},
    }
    startup = {
        "name": "startup",
        "title": "start-up",
        "judged": "",
        "figures": {"all_held": gap * 10, "spread": 0 if balanced_ok else 2},
        "goals": {"balance within 1 lease": balanced_ok},
    }
    run = {
        "phases": [startup, planned],
        "verified": {"written": 10, "handled_ids": 10, "twice": twice, "lost": 0, "unknown": 0},
    }
    return {"runs": {"per-lease": run}, "seconds": 100}


def test_fleet_rounds_give_medians_goals_on_them_and_every_round() -> None:
    got = fleet.combine(
        [
            fleet_result(1.2, 0.3, 0, True),
            fleet_result(0.8, 0.6, 0, False),
            fleet_result(0.9, 0.4, 0, True),
        ]
    )
    startup, rolling = got["runs"]["per-lease"]["phases"]
    assert rolling["figures"]["gap_max"] == 0.9
    assert rolling["figures"]["delay_p99"] == 0.4
    assert rolling["per_shard"] == {"s": {"gap_max": 0.9}}  # the median round's
    assert rolling["goals"] == {
        "worst gap <= 1 s": True,
        "record delay p99 <= 0.5 s": True,
        "0 twice": True,
        "0 lost": True,
    }
    assert [r["gap_max"] for r in rolling["rounds"]] == [1.2, 0.8, 0.9]
    assert startup["figures"]["all_held"] == 9.0
    assert startup["goals"] == {"balance within 1 lease": False}  # missed in one round
    assert got["runs"]["per-lease"]["verified"]["written"] == 30
    assert got["repeat"] == 3
    assert got["seconds"] == 300
    notes = fleet.rounds_notes(got)
    assert "per-lease, rolling: worst gap per round 1.20 s / 0.80 s / 0.90 s" in notes[1]

    twice = fleet.combine([fleet_result(0.5, 0.3, 0, True), fleet_result(0.5, 0.3, 3, True)])
    assert twice["runs"]["per-lease"]["phases"][1]["goals"]["0 twice"] is False
