"""The Spark chaos soak, compressed to two minutes (``bench/chaos_spark.py --short``), in the suite.

Real OS processes: a Spark standalone cluster (Master, two Workers, executor JVMs), the driver
of the demo's jobs as a process of its own, kinesis-local and moto's S3 behind fault proxies;
an executor and the driver killed with micro-batches in flight, Kinesis and S3 brownouts and
throttling, a split and a merge of the source stream. The script stops itself (bounded
schedule and drain) and signals only the PIDs it started. What it checks, and that each check
can fail, is tested in ``tests/unit/bench/test_chaos_spark_check.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.soak import run_soak

# Every fault class of the short schedule runs; none is left out.
FAULT_CLASSES = {
    "executor_kill",
    "kinesis_brownout",
    "split",
    "driver_kill",
    "s3_brownout",
    "kinesis_throttle",
    "merge",
    "s3_throttle",
}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_minutes_of_spark_faults_write_every_event_once_and_every_alert(
    tmp_path: Path,
) -> None:
    # about 5 minutes; the bound is for a machine in trouble
    result, output = run_soak("chaos_spark.py", ["--short"], tmp_path, bound_s=780)
    report = result["report"]
    assert set(result["faults"]) == FAULT_CLASSES, output
    assert result["actions_failed"] == [], output
    assert report["events_acked"] > 1000, output
    # No query failed: a brownout or a lost executor delays batches (the driver is restarted
    # only when the soak kills it).
    assert result["driver_failures"] == [], output
    # Every proxy fault failed requests; every kill caught a micro-batch in flight.
    assert report["silent_faults"] == [], output
    assert report["uninterrupting"] == [], output
    assert report["stalled"] == [], output
    assert report["lost"] == 0, (report["examples"], output)
    assert report["duplicated"] == 0, (report["examples"], output)
    assert report["unexpected"] == 0, (report["examples"], output)
    assert report["alerts_missing"] == 0, (report["examples"], output)
    assert report["alert_duplicates_by_cause"].get("unexplained", 0) == 0, output
    assert report["stuck"] == [], output
    assert result["drained_after"] is not None, output
    assert result["passed"], output
