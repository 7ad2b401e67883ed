"""`make demo` (``python examples/demo``) works on a machine that has no AWS configuration at all (as on a fresh clone).

The Spark pipeline runs small (600 events fed over 3 s) but whole: the local stack, both
streaming queries, the sink, the consumer and the end-to-end verification.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"  # `make demo` runs `python examples/demo`


def without_aws_configuration(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-credentials")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    # The demo picks Spark's worker interpreter itself; nothing inherited may decide it.
    env.pop("PYSPARK_PYTHON", None)
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", [[], ["--cluster"]], ids=["local", "cluster"])
def test_spark_demo_verifies_every_event_end_to_end(tmp_path: Path, where: list[str]) -> None:
    output = tmp_path / "demo-output"
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = without_aws_configuration(tmp_path)
    env["TMPDIR"] = str(temp)
    done = subprocess.run(
        [
            sys.executable,
            str(DEMO),
            "--events",
            "600",
            "--feed-seconds",
            "3",
            "--output",
            str(output),
            "--timeout",
            "240",
            *where,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    shown = done.stdout[-4000:] + done.stderr[-3000:]
    assert done.returncode == 0, shown
    if where:
        assert "starting Spark (the cluster)" in done.stdout, shown
    assert "verified: every one of 600 events counted exactly once" in done.stdout, shown
    assert "exactly one consumed alert" in done.stdout
    parquet = output / "revenue-per-minute"
    assert str(parquet) in done.stdout.replace("\n", "")
    assert list(parquet.glob("part-*.parquet")), "the Parquet output is kept"
    # The working files (checkpoints, the source's metadata) are gone.
    assert not list(temp.glob("shardflow-demo-work-*"))


def test_foundation_demo_runs_without_any_aws_configuration(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO), "--foundation", "--events", "600"],
        env=without_aws_configuration(tmp_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "verified: all 600 events arrived exactly once" in done.stdout
