"""A shardflow consumer worker for mixed-fleet runs: logs every handled record like the KCL
processor does (``support.kcl.handled``), stops gracefully on SIGTERM.

    python -m support.kcl.shardflow_worker --stream S --application A --worker-id W --out F

(with ``tests`` on ``PYTHONPATH`` and the AWS endpoint variables set). Its log shows the fleet
mode and every lease move.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from shardflow.consumer import ConsumedRecord, Consumer, ConsumerSettings
from shardflow.leases.settings import LeaseSettings
from support.kcl.handled import record_line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", required=True)
    parser.add_argument("--application", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--failover", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(created).3f %(name)s %(message)s")
    logging.getLogger("shardflow").setLevel(logging.INFO)
    fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    worker = args.worker_id

    def handle(record: ConsumedRecord[bytes]) -> None:
        key = record.data.split(b"|", 1)[0][:64].decode(errors="replace")
        line = record_line(
            worker,
            record.shard_id,
            record.sequence_number,
            record.sub_sequence_number or 0,
            key,
            time.time(),
        )
        os.write(fd, line.encode())

    settings = ConsumerSettings(worker_id=worker, leases=LeaseSettings(failover_time=args.failover))
    consumer = Consumer(args.stream, args.application, settings=settings)
    consumer.run(handle)  # SIGTERM: graceful stop (hands leases over), then returns
    os.close(fd)


if __name__ == "__main__":
    main()
