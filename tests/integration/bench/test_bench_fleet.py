"""bench/fleet.py at test size: 32 shards, 4 worker processes, start-up, a rolling restart of
all 4 workers (one at a time), scale-out 4 -> 6 / in 6 -> 4 and a kill -9, on kinesalite with the lease
table on dynalite (the bench starts both). No record is lost or handled twice in the rolling
restart, every shard is processed, and every shard of the killed worker is taken over.

The full run (256 shards, 8 workers, the idle minute too) is
``.venv/bin/python bench/fleet.py``; this one takes about a minute.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.bench import load_bench

pytestmark = pytest.mark.slow

fleet = load_bench("fleet")


def test_a_rolling_restart_of_4_workers_on_32_shards_loses_and_repeats_nothing() -> None:
    config = fleet.Config(
        shards=32,
        workers=4,
        phases=("startup", "rolling", "scale", "kill"),
        steady=4.0,
        observe=3.0,
        settle=60.0,
        fallback=False,
    )
    said: list[str] = []
    result: dict[str, Any] = fleet.run(config, say=said.append)
    report = "\n".join(said)

    phases = {phase["name"]: phase for phase in result["phases"]}
    assert list(phases) == ["startup", "rolling", "scale_out", "scale_in", "kill"], report
    startup = phases["startup"]["figures"]
    assert startup["all_processing"] is not None, report
    assert startup["steady"]["shards_processing"] == 32, report
    rolling = phases["rolling"]["figures"]
    assert [step["new_ready"] is not None for step in rolling["steps"]] == [True] * 4, report
    assert rolling["lost"] == 0, report
    assert rolling["twice"] == 0, report
    assert rolling["shards_processing"] == 32, report
    kill = phases["kill"]["figures"]
    assert kill["leases"] > 0, report
    assert kill["not_taken_over"] == 0, report
    verified = result["verified"]
    assert verified["written"] > 0
    assert verified["lost"] == 0, report
    assert verified["handled_ids"] == verified["written"], report
    # The table the docs would show renders from this result.
    assert "rolling restart of all 4 workers" in fleet.render(result)
