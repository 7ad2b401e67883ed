"""The Spark driver of ``bench/chaos_spark.py``: the demo's streaming jobs on the standalone cluster,
run as a process of its own so that the soak can kill -9 it and start it again.

    python bench/chaos_spark_driver.py CONFIG_JSON

Two queries over the orders stream, both through the shardflow source with their batch ends on
S3 (moto, behind the soak's fault proxy), both from ``examples/demo/jobs.py``:

- **events**: the demo's parsed business events (``business_events``, the revenue job's input)
  into a Parquet file sink, one row per event: the soak checks every event exactly once by id;
- **alerts**: the demo's alerts job unchanged (large orders to the alerts stream through the
  shardflow sink): every alert at least once.

Spark's own checkpoints stay on the local disk (the pip-installed pyspark has no S3A file
system); the event log (task ends, executor losses) goes to ``work/eventlog`` for the soak to
count the tasks each fault interrupted. The driver runs until the file ``work/stop`` appears,
then stops both queries and exits 0; a failed query exits 1 (the soak restarts the driver, as
a supervisor would, and records it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TRIGGER = "2 seconds"
STOP_POLL = 0.5


def main() -> None:
    config = json.loads(sys.argv[1])
    sys.path.insert(0, str(EXAMPLES))
    from demo.jobs import Endpoints, business_events, start_alerts_job, start_spark

    work = Path(config["work"])
    events_log = work / "eventlog"
    events_log.mkdir(parents=True, exist_ok=True)
    spark_settings = {
        **config["spark"],
        "spark.app.name": "shardflow-chaos-spark",
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events_log.as_uri(),
        # One plain file per driver, written in small pieces: a driver killed with -9 leaves
        # a readable log that lacks at most its last few kilobytes.
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        "spark.eventLog.buffer.kb": "4k",
        # Every micro-batch's offsets and commits files stay (Spark deletes all but the last
        # 100 by default): the soak reads when each batch was planned and committed from them.
        "spark.sql.streaming.minBatchesToRetain": "100000",
        # An executor lost is not the task's fault; a brownout may fail a task's attempts
        # while it lasts: Spark's default of 4 attempts is what is under test, kept as is.
        "spark.task.maxFailures": "4",
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = start_spark(work, spark_settings)
    where = Endpoints(
        kinesis_url=config["kinesis"],
        region=config["region"],
        orders_stream=config["orders"],
        alerts_stream=config["alerts"],
        metadata_root=config["metadata"],
        metadata_endpoint=config["s3"],
    )
    events = business_events(spark, where, work, "events").select("event_id", "type", "order_id")
    queries = [
        events.writeStream.queryName("events")
        .format("parquet")
        .option("path", config["out"])
        .option("checkpointLocation", str(work / "checkpoint-events"))
        .trigger(processingTime=TRIGGER)
        .start(),
        start_alerts_job(spark, where, work),
    ]
    print(f"DRIVER STARTED {os.getpid()} {time.time():.3f}", flush=True)
    stop = work / "stop"
    failed = False
    while not stop.exists():
        for query in queries:
            if not query.isActive:
                error = query.exception()
                print(f"QUERY FAILED {query.name}: {error}", flush=True)
                failed = True
        if failed:
            break
        time.sleep(STOP_POLL)
    for query in queries:
        if query.isActive:
            query.stop()
    spark.stop()
    print("DRIVER FAILED" if failed else "DRIVER DONE", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
