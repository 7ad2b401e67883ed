"""``shardflow multilang``'s allocator setting: megabyte blocks freed go back to the system."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Frees a 4 MiB block (glibc then serves blocks below 4 MiB from the heap), then holds 30 blocks
# of 1 MiB and frees all but the last (which keeps the heap from shrinking from its top):
# prints how many MiB of RSS the 29 freed blocks gave back.
PROGRAM = r"""
import sys
from shardflow.multilang.memory import release_large_buffers

def rss():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS")) / 1024

if sys.argv[1] == "released":
    assert release_large_buffers()
big = bytearray(4 << 20)
del big
blocks = [bytearray(1 << 20) for _ in range(30)]
held = rss()
del blocks[:-1]
print(held - rss())
"""


def given_back(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(done.stdout)


@pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="glibc only",
)
def test_freed_megabyte_blocks_leave_the_process() -> None:
    assert given_back("default") < 5  # glibc's own setting: they stay in the heap
    assert given_back("released") > 25  # fixed threshold: each was mapped, and unmapped


def test_a_threshold_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardflow.multilang.memory import release_large_buffers

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert release_large_buffers() is False
