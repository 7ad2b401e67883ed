"""Way in 1: ``consume(handler)`` — shardflow does leases, checkpoints and shutdown.

    eval "$(shardflow local up --quiet)"
    shardflow stream create orders --shards 2
    printf '{"customer": "c1", "amount": 10}\n' | shardflow produce orders --key-field customer
    python examples/consume_handler.py orders billing --stop-after 1

Without ``--stop-after`` it runs until SIGTERM / Ctrl-C (final checkpoints, leases released).
"""

from __future__ import annotations

import argparse

from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.records import as_json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stream")
    parser.add_argument("application")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args()

    consumer = Consumer(
        args.stream, args.application, settings=ConsumerSettings(deserializer=as_json)
    )
    handled = 0

    async def handle(record: ConsumedRecord) -> None:  # a plain `def` would run in a thread pool
        nonlocal handled
        order = record.value
        print(f"{record.shard_id} {record.sequence_number} {order}", flush=True)
        handled += 1  # returning acknowledges the record; checkpoints follow automatically
        if args.stop_after is not None and handled >= args.stop_after:
            consumer.request_stop()

    consumer.run(handle)  # blocks; SIGTERM / SIGINT stop it gracefully


if __name__ == "__main__":
    main()
