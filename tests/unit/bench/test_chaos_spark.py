"""bench/chaos_spark.py's own sizing: the producer outlasts the soak's longest timeline."""

from __future__ import annotations

from support.bench import load_bench

soak = load_bench("chaos_spark")


def test_the_producer_writes_until_the_soak_stops_it_even_when_everything_runs_late() -> None:
    # make test on a loaded machine: the queries ran after 145 s, not 70 s, and the driver's
    # restart took minutes; the producer, sized for 120 s of faults + 120 s, ran dry at 291 s
    # while 4 faults were still to come, none of which could then be seen recovering.
    args = soak.parse_args(["--short"])
    faults = len(soak.SHORT_SCHEDULE)
    events = soak.events_to_produce(args, faults)
    seconds_of_writing = events / args.rate
    # Every fault waited out its predecessor's recovery to the limit, the queries' start too.
    longest = args.start_timeout + args.duration + faults * args.settle + args.quiet
    assert seconds_of_writing >= longest
    # The case that ran dry: 145 s to start, 2 recoveries of 120 s, the schedule, --quiet.
    assert seconds_of_writing >= 145 + 2 * 120 + args.duration + args.quiet
