"""run_consumer / Consumer.run in a real process: SIGTERM stops gracefully, a second signal at once.

The child process consumes an in-memory stream (no servers): signals need a main thread of
their own, hence a process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import asyncio
import sys

from shardflow.aws import OpenClients
from shardflow.consumer import run_consumer
from shardflow.leases import InMemoryLeaseStore
from shardflow.testing import MemoryKinesis, fast_settings

kinesis = MemoryKinesis()
kinesis.create_stream("s", 2)
kinesis.put_many("s", [(f"k{i}", f"{i}".encode()) for i in range(50)])
store = InMemoryLeaseStore("app")
handled = 0
STUCK = sys.argv[1] == "stuck"


async def handle(record):
    global handled
    handled += 1
    if handled == 50 or STUCK:
        print("ready", flush=True)
    if STUCK:
        await asyncio.sleep(3600)


try:
    run_consumer("s", "app", handle, settings=fast_settings(drain_timeout=30.0),
                 clients=OpenClients(kinesis=kinesis),
                 lease_store=store)
except asyncio.CancelledError:
    print("cancelled", flush=True)
    sys.exit(3)
leases = asyncio.run(store.list_leases())
print("done", handled, flush=True)
for lease in leases:
    print(lease.lease_key, lease.checkpoint, lease.lease_owner, flush=True)
    last = kinesis.records("s", lease.shard_id)[-1][0]
    assert str(lease.checkpoint) == last, (lease.checkpoint, last)
"""


def start(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "consumer_script.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()  # bounded by the test timeout; the child prints or dies
    assert line.strip() == "ready", (line, process.stderr.read() if process.stderr else "")


def test_sigterm_stops_gracefully_with_final_checkpoints_and_released_leases(
    tmp_path: Path,
) -> None:
    process = start(tmp_path, "normal")
    try:
        wait_ready(process)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "done 50"
    leases = [line.split() for line in lines[1:]]
    assert len(leases) == 2
    assert all(owner == "None" for _, _, owner in leases)  # released
    assert "SIGTERM received: stopping gracefully" in err


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    process = start(tmp_path, "stuck")
    try:
        wait_ready(process)
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)  # the graceful stop now waits for the stuck handler (30 s)
        assert process.poll() is None
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert time.monotonic() - started < 10
    assert "cancelled" in out, err
    assert process.returncode == 3
