"""Every code block of the README and the docs runs as written, in the order a reader meets them.

The pages run in reading order (the README, then the site's navigation) on one local stack and
in one working directory, after what Getting started leaves behind: the stack its ``eval
"$(shardflow local up --quiet)"`` started and its stream ``orders`` with two records. That is a
reader who follows Getting started and then the guides, one after the other, in one shell: a
page that trips over what an earlier one left (a stream created twice, records it cannot
deserialize, the stack stopped) fails here. ``-k PAGE`` runs one page alone after Getting
started. The pages share one pytest-xdist worker (:mod:`support.ordering`), so that ``make
test`` runs them in order too.

Each block runs on its own, as a reader would paste it: a shell block in a new bash, a Python
block as a new program (it needs no names of an earlier block). The region, endpoints and
credentials come from the environment exactly as ``eval "$(shardflow local up --quiet)"`` sets
them. Blocks that cannot run as written carry a visible reason in a ``docs-test`` mark (see
:mod:`support.doc_blocks`); Getting started itself is run by the first-hour test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.doc_blocks import ROOT, DocBlock, blocks, documentation_files, reading_order

pytestmark = pytest.mark.slow

_NOT_HERE = frozenset({"skip", "first-hour", "example"})
_BIN = Path(sys.executable).parent
_GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def _to_run(page: Path) -> list[DocBlock]:
    return [b for b in blocks(page) if b.runnable and b.kind not in _NOT_HERE]


PAGES = [p for p in reading_order() if any(b.kind != "file" for b in _to_run(p))]


def test_every_block_is_run_or_says_why_not() -> None:
    for page in documentation_files():
        for block in blocks(page):
            if block.kind == "skip":
                assert len(block.argument) > 10, f"{block.where}: say why it is not run"
            if block.kind == "file":
                assert block.argument, f"{block.where}: which file?"


def test_readme_quickstart_is_getting_started() -> None:
    readme = [b.text for b in blocks(ROOT / "README.md")]
    started = [b.text for b in blocks(_GETTING_STARTED)]
    assert started[0] in readme  # the handler
    assert started[1] in readme  # the five commands


def test_examples_the_docs_point_to_are_in_the_docs() -> None:
    """A pip user has the docs, not the repository: an ``examples/`` file the docs mention is
    shown whole in them (an ``example`` block, checked to be the file verbatim); only the demo
    is a clone's, and its mentions say so."""
    inline = set()
    for page in documentation_files():
        for block in blocks(page):
            if block.kind == "example":
                assert (ROOT / block.argument).read_text() == block.text, (
                    f"{block.where}: not {block.argument} as it is"
                )
                inline.add(block.argument)
    for page in documentation_files():
        for mention in re.findall(r"examples/[\w./-]*\w", page.read_text()):
            if mention.startswith("examples/demo"):
                continue
            path = ROOT / mention
            files = sorted(path.rglob("*.*")) if path.is_dir() else [path]
            named = [str(f.relative_to(ROOT)) for f in files if "__pycache__" not in f.parts]
            missing = [name for name in named if name not in inline]
            assert not missing, f"{page.relative_to(ROOT)} points to {mention}: {missing}"


@dataclass(frozen=True)
class Reader:
    """Where the pages run: the environment of the reader's shell and their directory."""

    env: dict[str, str]
    workdir: Path


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    """The stack and the stream Getting started leaves behind, started as it starts them."""
    root = tmp_path_factory.mktemp("reader")
    workdir = root / "work"
    workdir.mkdir()
    env = {
        **os.environ,
        "SHARDFLOW_STATE_DIR": str(root / "state"),
        "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    up = subprocess.run(
        ["shardflow", "local", "up", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stderr
        for line in up.stdout.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        five = next(b for b in blocks(_GETTING_STARTED) if b.kind == "first-hour")
        lines = five.text.splitlines()
        made = [line for line in lines if line.startswith(("shardflow stream", "printf"))]
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", "\n".join(made)],
            env=env,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        yield Reader(env, workdir)
    finally:
        subprocess.run(["shardflow", "local", "down"], env=env, timeout=120, check=False)


# The Spark guide runs three Spark programs, a JVM each: about 100 s on a quiet 2-core
# machine, and 288 s once under load (CI's run stopped it at the default 300 s).
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_runs_as_written(page: Path, reader: Reader) -> None:
    for index, block in enumerate(_to_run(page)):
        if block.kind == "file":
            (reader.workdir / block.argument).write_text(block.text)
            continue
        _run(block, index, reader.env, reader.workdir)


def _command(block: DocBlock, index: int, workdir: Path) -> list[str]:
    if block.language == "python":
        script = workdir / f"block_{block.path.stem}_{index}.py"
        script.write_text(block.text)
        return [sys.executable, str(script)]
    return ["bash", "-e", "-o", "pipefail", "-c", block.text]


def _run(block: DocBlock, index: int, env: dict[str, str], workdir: Path) -> None:
    command = _command(block, index, workdir)
    if block.kind != "until-interrupted":
        done = subprocess.run(
            command, cwd=workdir, env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
        _assert_untroubled(block, done.stdout + done.stderr)
        return
    # Runs until Ctrl-C: let it work for the marked seconds, then interrupt it like a terminal.
    seconds = float(block.argument or 5)
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    time.sleep(seconds)
    assert process.poll() is None, f"{block.where} ended early:\n{process.communicate()[0]}"
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, f"{block.where} after Ctrl-C:\n{output}"
    _assert_untroubled(block, output)


def _assert_untroubled(block: DocBlock, output: str) -> None:
    """A block that succeeds may still have met what an earlier page left: a consumer that
    parked a shard on a record it cannot deserialize, an error logged with its traceback."""
    for trouble in ("Traceback (most recent call last)", "stopped and parked"):
        assert trouble not in output, f"{block.where}: {trouble!r} in its output:\n{output}"
