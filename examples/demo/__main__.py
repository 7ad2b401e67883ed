"""``make demo`` (``python examples/demo``): the Spark pipeline on the local stack.

``--foundation`` runs the earlier demo instead: produce and read back, without Spark. The demo
lives in the repository, not in the wheel: it needs shardflow with its ``spark`` extra (``make
setup`` installs it) and, for ``--cluster``, the test suite's standalone cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as `python examples/demo`: the package `demo` is its directory
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from demo.needs import missing


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python examples/demo",
        description="shardflow end-to-end demo on the embedded local stack",
    )
    parser.add_argument("--events", type=int, default=None, help="events to produce")
    parser.add_argument(
        "--feed-seconds", type=float, default=45.0, help="spread producing over this long"
    )
    parser.add_argument("--shards", type=int, default=None, help="shards of the orders stream")
    parser.add_argument(
        "--output", type=Path, default=None, help="directory for the Parquet output"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (seconds)")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run Spark as a standalone cluster (Master + 2 Workers), batch ends on S3 (moto)",
    )
    parser.add_argument(
        "--foundation", action="store_true", help="the demo without Spark (producer, reader)"
    )
    args = parser.parse_args()
    problem = missing(spark=not args.foundation)
    if problem is not None:
        print(f"shardflow demo: {problem}", file=sys.stderr)
        sys.exit(2)
    if args.foundation:
        from demo import foundation

        sys.exit(foundation.main(args.events or 5000, args.shards or 4))

    from demo.pipeline import DemoSettings, run_pipeline

    settings = DemoSettings(
        events=args.events or 6000,
        feed_seconds=args.feed_seconds,
        shards=args.shards or 2,
        output=args.output,
        timeout=args.timeout,
        cluster=args.cluster,
    )
    ok = run_pipeline(settings, Console())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
