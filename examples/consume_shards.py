"""Way in 2: ``shards()`` — your own loop per shard, your own checkpoints.

python examples/consume_shards.py orders billing-audit --stop-after 1
"""

from __future__ import annotations

import argparse
import asyncio

from shardflow.consumer import Consumer


async def run(stream: str, application: str, stop_after: int | None) -> None:
    consumer = Consumer(stream, application)
    handled = 0

    async def work(batches, checkpointer) -> None:  # type: ignore[no-untyped-def]
        nonlocal handled
        async for batch in batches:
            for record in batch:
                print(f"{record.shard_id} {record.sequence_number} {record.data!r}", flush=True)
                checkpointer.stage(record)  # handled; written by count / interval / at the end
            await checkpointer.checkpoint(batch[-1])  # or write now, up to and including
            handled += len(batch)
            if stop_after is not None and handled >= stop_after:
                consumer.request_stop()

    async with asyncio.TaskGroup() as tasks:
        async for shard_id, batches, checkpointer in consumer.shards():
            tasks.create_task(work(batches, checkpointer), name=shard_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stream")
    parser.add_argument("application")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(run(args.stream, args.application, args.stop_after))


if __name__ == "__main__":
    main()
