"""A million mutated KPL aggregates through the consumer's intake: not one unexpected exception.

Each mutated aggregate carries a valid MD5, so it reaches the protobuf parser and the field
checks. They go through :class:`~shardflow.read.intake.RecordIntake` as GetRecords
batches of 1,000, with a shard hash range (so every user record's hash key is computed), in
two processes (the work splits by seed; :mod:`support.intake_fuzz` is what each one runs).
Every input must come out: as its user records, or whole as a plain record; nothing raised,
nothing dropped, positions strictly increasing.

``SHARDFLOW_FUZZ_AGGREGATES`` sets how many (default 1,000,000; more for a longer hunt).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

from support.intake_fuzz import fuzz

TOTAL = int(os.environ.get("SHARDFLOW_FUZZ_AGGREGATES", "1000000"))
PROCESSES = 2


def test_a_million_mutated_aggregates_pass_intake_without_an_unexpected_exception() -> None:
    shares = [TOTAL // PROCESSES + (i < TOTAL % PROCESSES) for i in range(PROCESSES)]
    # Fresh interpreters, not forks of this process: a fork inherits what earlier tests left
    # in it, such as the Spark sink's pooled producers, whose exit hooks then held each fork
    # at its exit for over a minute.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=spawn) as pool:
        tallies = list(pool.map(fuzz, range(1, PROCESSES + 1), shares))
    problems = [problem for tally in tallies for problem in tally.problems]
    assert not problems
    assert (
        sum(t.aggregates for t in tallies) == TOTAL >= 1_000_000
        or "SHARDFLOW_FUZZ_AGGREGATES" in os.environ
    )
    assert sum(t.plain + t.unpacked for t in tallies) == TOTAL
    # The mutations reach both outcomes in quantity: the fuzzing is not vacuous.
    assert sum(t.unpacked for t in tallies) > TOTAL // 20
    assert sum(t.plain for t in tallies) > TOTAL // 2
