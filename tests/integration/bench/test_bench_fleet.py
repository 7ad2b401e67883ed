"""bench/fleet.py at test size: 32 shards, 4 worker processes, start-up, a rolling restart of
all 4 workers (one at a time), scale-out 4 -> 6 / in 6 -> 4 and a kill -9, on kinesalite with the
lease table on dynalite (the bench starts both), in both lease modes: per-lease renewals, then
one heartbeat item per worker (the mode stored in the table before the workers start), each on
fresh emulators. No record is lost or handled twice in the planned moves, every shard is
processed, every shard of the killed worker is taken over, and the table ran in the mode asked
for.

The full run (256 shards, 8 workers, the idle minute too) is ``.venv/bin/python bench/fleet.py``;
this one takes about a minute per mode.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.bench import load_bench

pytestmark = pytest.mark.slow

fleet = load_bench("fleet")

MODES = ("per-lease", "heartbeat")


def test_a_fleet_of_4_workers_on_32_shards_loses_and_repeats_nothing_in_planned_moves() -> None:
    config = fleet.Config(
        shards=32,
        workers=4,
        phases=("startup", "rolling", "scale", "kill"),
        steady=4.0,
        observe=3.0,
        settle=60.0,
        fallback=False,
        lease_modes=MODES,
    )
    said: list[str] = []
    result: dict[str, Any] = fleet.run(config, say=said.append)
    report = "\n".join(said)

    assert list(result["runs"]) == list(MODES), report
    for mode, run in result["runs"].items():
        phases = {phase["name"]: phase for phase in run["phases"]}
        assert list(phases) == ["startup", "rolling", "scale_out", "scale_in", "kill"], report
        assert run["table_at_end"]["lease_mode"] == mode, report
        if mode == "heartbeat":
            # One heartbeat item per live worker: the workers kept the mode's items.
            assert run["table_at_end"]["heartbeat_items"] >= 3, report  # 4 - the killed one
        startup = phases["startup"]["figures"]
        assert startup["all_processing"] is not None, report
        assert startup["steady"]["shards_processing"] == 32, report
        rolling = phases["rolling"]["figures"]
        assert [step["new_ready"] is not None for step in rolling["steps"]] == [True] * 4, report
        for name in ("rolling", "scale_out", "scale_in"):
            figures = phases[name]["figures"]
            assert figures["lost"] == 0, (name, report)
            assert figures["twice"] == 0, (name, report)
        assert rolling["shards_processing"] == 32, report
        # The per-shard timelines found the rolling restart's moves in the workers' logs.
        handoffs = rolling["handoffs"]
        assert handoffs["moves"] > 0, report
        assert handoffs["stages"]["handed"]["logged"] > 0, report
        kill = phases["kill"]["figures"]
        assert kill["leases"] > 0, report
        assert kill["not_taken_over"] == 0, report
        verified = run["verified"]
        assert verified["written"] > 0
        assert verified["lost"] == 0, report
        assert verified["handled_ids"] == verified["written"], report
    # The table the docs would show renders from this result, a column per mode.
    table = fleet.render(result)
    assert "rolling restart of all 4 workers" in table
    assert all(f"lease mode {mode}" in table for mode in MODES)
