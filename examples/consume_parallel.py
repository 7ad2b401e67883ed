"""Key-ordered parallel processing with retries, dead letters and an idempotency guard.

    eval "$(shardflow local up --quiet)"
    shardflow stream create orders --shards 2
    printf '{"customer": "c1", "amount": 10}\n{"customer": "c2", "amount": -5}\n' \
        | shardflow produce orders --key-field customer
    python examples/consume_parallel.py orders billing --dead-letters dlq.jsonl --stop-after 2
    shardflow dlq show file:dlq.jsonl

Each customer's orders are handled in order, different customers in parallel (up to 64 records
in flight per shard). An order with a negative amount fails; after 3 calls it goes to the
dead letters (``--policy block-key``: the customer's later orders follow it there until
released), is acknowledged, and processing goes on. Records handled beyond the checkpoint are
stored with the lease, so a restart skips them; the in-memory guard skips records this process
has handled before.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from shardflow.backoff import Backoff
from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.consumer.checkpointing.checkpoint import CheckpointSettings
from shardflow.consumer.delivery import DispatchSettings, Idempotency
from shardflow.deadletter import JsonLinesDestination
from shardflow.idempotency import InMemoryIdempotencyGuard
from shardflow.records import Record, as_json


def customer_of(record: Record) -> str:  # the ordering key: a field of the payload
    return str(json.loads(record.data)["customer"])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stream")
    parser.add_argument("application")
    parser.add_argument("--dead-letters", default="dead-letters.jsonl")
    parser.add_argument("--policy", choices=["skip", "block-key"], default="skip")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args()

    settings = ConsumerSettings(
        deserializer=as_json,
        checkpoint=CheckpointSettings(every_n=100, interval=1.0, store_completed=True),
        dispatch=DispatchSettings(
            ordering="key",
            key=customer_of,
            max_in_flight_per_shard=64,
            retry=Backoff(base=0.05, cap=1.0, max_attempts=3),
            on_failure=args.policy,
            idempotency=Idempotency(InMemoryIdempotencyGuard()),
        ),
    )
    consumer = Consumer(args.stream, args.application, settings=settings)
    dead_letters = JsonLinesDestination(args.dead_letters)
    seen: set[tuple[str, str, int]] = set()

    async def handle(record: ConsumedRecord) -> None:
        seen.add((record.shard_id, record.sequence_number, record.sub_sequence_number))
        if args.stop_after is not None and len(seen) >= args.stop_after:
            consumer.request_stop()  # records in flight (retries, dead letters) still finish
        order = record.value
        if order["amount"] < 0:
            raise ValueError(f"negative amount {order['amount']}")
        await asyncio.sleep(0.01)  # the I/O that makes parallelism worth it
        print(f"{order['customer']} {order['amount']}", flush=True)

    try:
        await consumer.consume(handle, dead_letters=dead_letters)
    finally:
        await dead_letters.close()


if __name__ == "__main__":
    asyncio.run(main())
