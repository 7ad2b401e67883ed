"""`make demo` works on a machine that has no AWS configuration at all (as on a fresh clone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_without_any_aws_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-credentials")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "shardflow.demo", "--events", "600"],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "verified: all 600 events arrived exactly once" in done.stdout
