"""The first hour of a pip user, exactly as docs/getting-started.md tells it.

The wheel is built and installed with its ``[local]`` extra into a fresh virtualenv (by uv,
from its cache, so this stays quick and works offline once the cache is warm). Then the page's
blocks run as written, in bash, with that virtualenv first on PATH, a home directory of its
own and no AWS configuration at all: the handler file, the five commands (the consumer is
stopped with Ctrl-C once it printed both records), a second shell that looks around, the
restart that handles only the new record, and ``local down``.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.doc_blocks import ROOT, DocBlock, blocks

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "getting-started.md"
_EVAL_UP = 'eval "$(shardflow local up --quiet)"'


@dataclass
class Shell:
    """A bash script running in the user's environment, its stdout read line by line."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def wait_for(self, count: int, prefix: str, timeout: float) -> list[str]:
        """Lines read until ``count`` of them start with ``prefix``."""
        deadline = time.monotonic() + timeout
        while sum(line.startswith(prefix) for line in self.seen) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.process.poll() is not None and self.lines.empty()):
                raise AssertionError(f"waited for {prefix!r}; output so far: {self.seen}")
            try:
                self.seen.append(self.lines.get(timeout=min(remaining, 0.5)))
            except queue.Empty:
                continue
        return self.seen

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C: SIGINT to the whole process group, as a terminal sends it."""
        os.killpg(self.process.pid, signal.SIGINT)
        code = self.process.wait(timeout=timeout)
        self.drain()
        return code

    def drain(self) -> None:
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the wheel built from this checkout, with ``[local]``."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv is not None, "uv comes with the dev extras (make setup)"
    dist = tmp_path_factory.mktemp("dist")
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([uv, "build", "--wheel", "--out-dir", dist, ROOT], check=True, timeout=300)
    (wheel,) = dist.glob("shardflow-*.whl")
    subprocess.run([uv, "venv", "--seed", "--python", sys.executable, venv], check=True)
    subprocess.run(
        [uv, "pip", "install", "--python", venv / "bin" / "python", f"shardflow[local] @ {wheel}"],
        check=True,
        timeout=600,
    )
    return venv


@pytest.fixture
def user_env(user_venv: Path, tmp_path: Path) -> dict[str, str]:
    """A new user's shell: the virtualenv activated, their own home, no AWS settings."""
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SHARDFLOW_"))}
    for name in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "PYTHONPATH"):
        keep.pop(name, None)
    return {
        **keep,
        "HOME": str(home),
        "VIRTUAL_ENV": str(user_venv),
        "PATH": f"{user_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def shells(user_env: dict[str, str], workdir: Path) -> Iterator[list[Shell]]:
    started: list[Shell] = []
    yield started
    for shell in started:
        if shell.process.poll() is None:
            os.killpg(shell.process.pid, signal.SIGKILL)
            shell.process.wait()
    # Whatever the outcome, no server of this test outlives it.
    subprocess.run(
        ["shardflow", "local", "down"], env=user_env, cwd=workdir, timeout=60, check=False
    )


def _start(script: str, env: dict[str, str], cwd: Path, shells: list[Shell]) -> Shell:
    process = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: Ctrl-C reaches bash and the consumer
    )
    shell = Shell(process)
    shells.append(shell)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            shell.lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return shell


def _run(script: str, env: dict[str, str], cwd: Path, shells: list[Shell]) -> list[str]:
    shell = _start(script, env, cwd, shells)
    code = shell.process.wait(timeout=120)
    time.sleep(0.1)
    shell.drain()
    assert code == 0, "\n".join(shell.seen)
    return shell.seen


def _page_blocks() -> list[DocBlock]:
    found = [b for b in blocks(PAGE) if b.runnable]
    assert found, f"no code blocks in {PAGE}"
    return found


def _handled(lines: list[str]) -> list[str]:
    """The handler's own lines: ``<shard id> <sequence number> <value>``."""
    return [line for line in lines if line.startswith("shardId-")]


def test_getting_started_as_written(
    user_env: dict[str, str], workdir: Path, shells: list[Shell]
) -> None:
    handler, five, look_around, restart, down = _page_blocks()
    assert handler.kind == "file", handler.where
    (workdir / handler.argument).write_text(handler.text)
    assert five.text.count("\n") == 5, f"{five.where}: five commands, one per line"
    assert five.text.startswith("pip install 'shardflow[local]'")

    first = _start(five.text, user_env, workdir, shells)
    first.wait_for(2, "shardId-", timeout=120)
    assert first.interrupt() == 0, "\n".join(first.seen)
    assert len(_handled(first.seen)) == 2, first.seen

    # A second shell: the `eval` line the page asks for, then its commands.
    seen = _run(f"{_EVAL_UP}\n{look_around.text}", user_env, workdir, shells)
    assert sum('"customer"' in line for line in seen) == 2, seen  # tail printed both records
    # `leases` piped: a header, then one lease a line, shard ids whole.
    header = next(i for i, line in enumerate(seen) if line.startswith("lease key"))
    leases = [line.split() for line in seen[header + 1 :]]
    assert [row[0] for row in leases] == ["shardId-000000000000", "shardId-000000000001"], seen
    assert all(row[-2:] == ["caught", "up"] for row in leases), seen
    assert "no --stream" not in "\n".join(seen), seen  # the stream comes from the lease table

    second = _start(f"{_EVAL_UP}\n{restart.text}", user_env, workdir, shells)
    second.wait_for(1, "shardId-", timeout=120)
    time.sleep(3)  # anything handled again would show up by now
    assert second.interrupt() == 0, "\n".join(second.seen)
    (again,) = _handled(second.seen)
    assert "'c3'" in again, second.seen

    # The demo (`make demo`) and the Spark test cluster are the repository's, not the wheel's.
    shipped = subprocess.run(
        ["python", "-c", "import importlib.util as u; print(*map(u.find_spec, ["
         "'shardflow.demo', 'shardflow.spark.cluster', 'shardflow.spark.datasource']))"],
        env=user_env,
        cwd=workdir,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert shipped.stdout.split()[:2] == ["None", "None"], shipped.stdout + shipped.stderr
    assert "shardflow.spark.datasource" in shipped.stdout  # the check can see a module

    seen = _run(down.text, user_env, workdir, shells)
    status = subprocess.run(
        ["shardflow", "local", "status"], env=user_env, cwd=workdir, capture_output=True, text=True
    )
    assert status.returncode != 0, status.stdout
