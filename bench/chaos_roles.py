"""The OS processes of the chaos soak (``bench/chaos.py``): one producer and the workers.

    python bench/chaos_roles.py producer --stream S --kinesis URL --out produced.tsv ...
    python bench/chaos_roles.py worker --stream S --app A --kinesis URL --dynamodb URL ...

Both write tab-separated lines with ``os.write`` on an ``O_APPEND`` descriptor, one line per
write, so a kill -9 loses no line that was written and lines of threads never interleave.

Producer lines (``produced.tsv``):

    W  key  seq  t                                                  a record handed to the producer
    A  key  seq  shard  sequence_number  sub_sequence_number  t    a record Kinesis acknowledged
    F  key  seq  error  t                                           a record the producer gave up
    P  key  kind  shard  sequence_number  t                         a poison record (acknowledged)

Worker lines (one file per worker incarnation):

    S  worker  shard  sequence_number  sub  key  seq  t             handler started
    E  worker  shard  sequence_number  sub  key  seq  t  outcome    handler ended (ok / raised)
    L  worker  event  shard  t  detail                              a lease / shard event
                                                                    (detail: how / why / PID)

``seq`` is the record's rank within its key, from 0, so per-key losses and order show.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import random
import sys
import time
from typing import Any

# The KPL aggregate magic; a poison "aggregate" starts with it and fails to decode.
KPL_MAGIC = b"\xf3\x89\x9a\xc2"
POISON = b"POISON"
UNDECODABLE = b"UNDECODABLE"
"""A record the workers' deserializer rejects: dead-lettered without a handler call."""
SLOW_FRACTION = 0.05
"""Of the handler calls, this share takes 50-200 ms (uniform); the rest about 1 ms."""


def handler_seconds(seed: int, shard: str, number: str, sub: int, slow: float) -> float:
    """How long the handler works on one record: heavy-tailed and seeded by the record's
    place, so a replay of the record takes as long as its first call.

    Most calls take about a millisecond (log-normal around 1 ms); ``slow`` of them take
    50-200 ms, long enough that a kill -9, a SIGSTOP or a lease lost during a brownout
    catches calls in flight at the soak's rates.
    """
    rng = random.Random(f"{seed}/{shard}/{number}/{sub}")
    if rng.random() < slow:
        return rng.uniform(0.050, 0.200)
    return min(0.010, rng.lognormvariate(-6.9, 0.5))  # median e**-6.9 s = 1.0 ms


class LineLog:
    """Appends whole lines to a file, one ``write`` each (atomic for short lines)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def line(self, *fields: object) -> None:
        os.write(self._fd, ("\t".join(str(f) for f in fields) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


# --- producer -------------------------------------------------------------------------------


async def produce(args: argparse.Namespace) -> None:
    """Put ``key|seq`` records round-robin over the keys at ``rate`` records/s until SIGTERM;
    every ``poison_every`` seconds one handler-refused record and one malformed aggregate."""
    import signal

    from shardflow import AwsSettings, Backoff, Producer, ProducerSettings
    from shardflow.aws import ClientFactory

    out = LineLog(args.out)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    aws = AwsSettings(endpoint_url=args.kinesis, read_timeout=10.0)
    settings = ProducerSettings(
        aggregate=args.aggregate,
        preserve_key_order=True,
        # Never give up: a brownout only delays records.
        retry=Backoff(base=0.1, cap=2.0, max_attempts=None),
        record_ttl=None,
        linger=0.1,
        shard_refresh_interval=5.0,
    )
    rng = random.Random(args.seed)
    seqs = dict.fromkeys((f"k{i:03d}" for i in range(args.keys)), 0)
    keys = list(seqs)
    pending: set[asyncio.Future[Any]] = set()

    def settle(key: str, seq: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            out.line("F", key, seq, "cancelled", f"{time.time():.6f}")
        elif future.exception() is not None:
            error = type(future.exception()).__name__
            out.line("F", key, seq, error, f"{time.time():.6f}")
        else:
            r = future.result()
            shard, number, sub = r.shard_id, r.sequence_number, r.sub_sequence_number
            out.line("A", key, seq, shard, number, sub, f"{time.time():.6f}")

    async with (
        Producer(args.stream, settings=settings, aws=aws) as producer,
        ClientFactory(aws).kinesis() as raw,
    ):
        started = time.monotonic()
        sent = 0
        next_poison = started + args.poison_every
        poisons = 0
        while not stop.is_set():
            now = time.monotonic()
            due = int((now - started) * args.rate) - sent
            for _ in range(max(0, due)):
                key = keys[sent % len(keys)]
                seq = seqs[key]
                seqs[key] += 1
                out.line("W", key, seq, f"{time.time():.6f}")
                future = await producer.put(f"{key}|{seq}".encode(), key)
                future.add_done_callback(lambda f, k=key, s=seq: settle(k, s, f))
                pending.add(future)
                future.add_done_callback(pending.discard)
                sent += 1
            if now >= next_poison and args.poison_every > 0:
                next_poison += args.poison_every
                # In a task: a malformed aggregate is retried through brownouts on its own.
                task = asyncio.create_task(
                    put_poison(producer, raw, args.stream, poisons, rng, out, stop)
                )
                pending.add(task)
                task.add_done_callback(pending.discard)
                poisons += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
        await asyncio.gather(*pending, return_exceptions=True)
        await producer.flush()
    out.close()


async def put_poison(
    producer: Any,
    raw: Any,
    stream: str,
    number: int,
    rng: random.Random,
    out: LineLog,
    stop: asyncio.Event,
) -> None:
    """One record the handler refuses and one the deserializer rejects (through the producer),
    and one malformed KPL aggregate with a valid MD5 (straight PutRecord, retried until
    acknowledged)."""
    for kind, prefix, payload in (
        ("refused", "poison", POISON),
        ("undecodable", "undecodable", UNDECODABLE),
    ):
        key = f"{prefix}-{number:04d}"
        future = await producer.put(payload + b"|" + str(number).encode(), key)

        def settle(done: asyncio.Future[Any], key: str = key, kind: str = kind) -> None:
            if done.cancelled() or done.exception() is not None:
                out.line("F", key, 0, "poison", f"{time.time():.6f}")
            else:
                shard, position = done.result().shard_id, done.result().sequence_number
                out.line("P", key, kind, shard, position, f"{time.time():.6f}")

        future.add_done_callback(settle)
    body = bytes(rng.randrange(256) for _ in range(40))
    data = KPL_MAGIC + body + hashlib.md5(body).digest()
    key = f"malformed-{number:04d}"
    while not stop.is_set():
        try:
            answer = await raw.put_record(StreamName=stream, Data=data, PartitionKey=key)
        except Exception:  # a brownout: try again, it must land to be counted
            await asyncio.sleep(0.5)
            continue
        out.line(
            "P", key, "malformed", answer["ShardId"], answer["SequenceNumber"], f"{time.time():.6f}"
        )
        return


# --- worker ---------------------------------------------------------------------------------


class RefusedRecord(Exception):
    """The handler's answer to a poison record: it goes to the dead letters."""


def make_handler(out: LineLog, worker: str, seed: int, slow: float) -> Any:
    def handle(record: Any) -> None:
        shard, number, sub = record.shard_id, record.sequence_number, record.sub_sequence_number
        key, _, seq = record.data.partition(b"|")
        poison = record.data.startswith((POISON, KPL_MAGIC)) or not seq.isdigit()
        key_text = record.partition_key if poison else key.decode()
        seq_text = "-" if poison else seq.decode()
        out.line("S", worker, shard, number, sub, key_text, seq_text, f"{time.time():.6f}")
        time.sleep(handler_seconds(seed, shard, number, sub, slow))
        if poison:
            out.line(
                "E", worker, shard, number, sub, key_text, seq_text, f"{time.time():.6f}", "raised"
            )
            raise RefusedRecord(f"poison record {record.partition_key}")
        out.line("E", worker, shard, number, sub, key_text, seq_text, f"{time.time():.6f}", "ok")

    return handle


async def work(args: argparse.Namespace) -> None:
    from shardflow import (
        AwsSettings,
        Backoff,
        CheckpointSettings,
        Consumer,
        ConsumerSettings,
        DispatchSettings,
        DynamoDBIdempotencyGuard,
        Idempotency,
        JsonLinesDestination,
        LeaseSettings,
        Polling,
    )
    from shardflow.aws import ClientFactory
    from shardflow.consumer.lifecycle.signals import install_stop_signals
    from shardflow.events import CheckpointWritten
    from shardflow.leases import DynamoDBLeaseStore

    out = LineLog(args.out)
    worker = args.worker_id
    out.line("L", worker, "Started", "", f"{time.time():.6f}", os.getpid())

    def on_event(event: Any) -> None:
        shard = getattr(event, "shard_id", "") or ""
        # How a lease was taken / why it ended: the ownership checker needs both.
        detail = getattr(event, "how", None) or getattr(event, "why", None) or ""
        if isinstance(event, CheckpointWritten):  # the checker dates what each one covers
            detail = f"{event.position.sequence_number}:{event.position.sub_sequence_number}"
        fields = [detail]
        lapse = getattr(event, "lapse", None)
        if lapse is not None:  # why an expired lease lapsed: the checker tells slow tables
            in_flight = "-" if lapse.in_flight is None else f"{lapse.in_flight:.3f}"
            fields.append(f"{in_flight}/{lapse.failed or '-'}")
        out.line("L", worker, type(event).__name__, shard, f"{time.time():.6f}", *fields)

    def decode(record: Any) -> bytes:
        if record.data.startswith(UNDECODABLE):
            raise ValueError("the chaos soak's undecodable poison")
        return bytes(record.data)

    failover = args.failover
    settings = ConsumerSettings(
        worker_id=worker,
        deserializer=decode,
        leases=LeaseSettings(
            failover_time=failover,
            shard_sync_interval=5.0,
            parent_poll_interval=1.0,
            pickup="poll",
            pickup_poll_interval=1.0,
            handoff_timeout=failover * 2,
        ),
        fetch=Polling(idle_time=0.25),
        checkpoint=CheckpointSettings(every_n=50, interval=2.0),
        drain_timeout=5.0,
        handler_threads=8,
        dispatch=None,  # set below, once the guard is open
    )
    kinesis_aws = AwsSettings(endpoint_url=args.kinesis, read_timeout=10.0)
    dynamodb = ClientFactory(AwsSettings(endpoint_url=args.dynamodb, read_timeout=10.0))
    letters = JsonLinesDestination(args.dead_letters)
    guarded = (
        DynamoDBIdempotencyGuard.connect(
            dynamodb,
            args.guard_table,
            create=False,
            claim_ttl=failover * 2,
            batch=args.batch_guard,
        )
        if args.guard_table
        else contextlib.nullcontext(None)
    )
    async with dynamodb.dynamodb() as client, guarded as guard:
        from dataclasses import replace

        settings = replace(
            settings,
            dispatch=DispatchSettings(
                ordering="key",
                max_in_flight_per_shard=64,
                retry=Backoff(base=0.05, cap=0.2, max_attempts=3),
                on_failure="skip",
                # Without the guard (--no-guard) every record reaches the handler: a stale
                # owner re-running records shows in the spans (lease fencing alone).
                idempotency=Idempotency(guard) if guard is not None else None,
            ),
        )
        consumer = Consumer(
            args.stream,
            args.app,
            settings=settings,
            aws=kinesis_aws,
            lease_store=DynamoDBLeaseStore(client, args.app),
            on_event=on_event,
        )
        uninstall = install_stop_signals(consumer.request_stop)
        # From here a SIGTERM is a graceful stop (before, it ends the process with -15): the
        # soak signals no worker before this line (a loaded machine takes seconds to get here).
        out.line("L", worker, "Ready", "", f"{time.time():.6f}")
        try:
            handler = make_handler(out, worker, args.seed, args.slow_fraction)
            await consumer.consume(handler, dead_letters=letters)
        finally:
            uninstall()
            await letters.close()
    out.line("L", worker, "Exited", "", f"{time.time():.6f}")
    out.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("producer")
    p.add_argument("--stream", required=True)
    p.add_argument("--kinesis", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--keys", type=int, default=64)
    p.add_argument("--poison-every", type=float, default=20.0)
    p.add_argument("--aggregate", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    w = sub.add_parser("worker")
    w.add_argument("--stream", required=True)
    w.add_argument("--app", required=True)
    w.add_argument("--kinesis", required=True)
    w.add_argument("--dynamodb", required=True)
    w.add_argument("--guard-table", required=True, help="empty: no idempotency guard")
    w.add_argument("--worker-id", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--dead-letters", required=True)
    w.add_argument("--failover", type=float, default=6.0)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument(
        "--batch-guard", action="store_true", help="the guard batches claims and completions"
    )
    w.add_argument("--slow-fraction", type=float, default=SLOW_FRACTION)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format="%(created).3f %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("botocore").setLevel(logging.WARNING)
    logging.getLogger("aiobotocore").setLevel(logging.WARNING)
    asyncio.run(produce(args) if args.role == "producer" else work(args))


if __name__ == "__main__":
    main()
