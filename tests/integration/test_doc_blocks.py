"""Every code block of the README and the docs runs as written against the local stack.

Each page gets its own moto server and working directory; its blocks run in order (a page is
a story: a stream created in one block is read in the next), with the region, endpoints and
credentials coming from the environment exactly as ``eval "$(shardflow local up --quiet)"``
sets them. Blocks that cannot run as written carry a visible reason in a ``docs-test`` mark
(see :mod:`support.doc_blocks`); Getting started is run by the first-hour test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shardflow.local import LocalStack
from support.doc_blocks import ROOT, DocBlock, blocks, documentation_files

pytestmark = pytest.mark.slow

_NOT_HERE = frozenset({"skip", "first-hour"})
_BIN = Path(sys.executable).parent


def _to_run(page: Path) -> list[DocBlock]:
    """The page's blocks to run, a ``continues`` block joined to the Python block before it."""
    found: list[DocBlock] = []
    for block in blocks(page):
        if not block.runnable or block.kind in _NOT_HERE:
            continue
        if block.kind == "continues":
            index = max(i for i, b in enumerate(found) if b.language == "python")
            found[index] = replace(found[index], text=found[index].text + block.text)
            continue
        found.append(block)
    return found


PAGES = [p for p in documentation_files() if any(b.kind != "file" for b in _to_run(p))]


def test_every_block_is_run_or_says_why_not() -> None:
    for page in documentation_files():
        for block in blocks(page):
            if block.kind == "skip":
                assert len(block.argument) > 10, f"{block.where}: say why it is not run"
            if block.kind == "file":
                assert block.argument, f"{block.where}: which file?"


def test_readme_quickstart_is_getting_started() -> None:
    readme = [b.text for b in blocks(ROOT / "README.md")]
    started = [b.text for b in blocks(ROOT / "docs" / "getting-started.md")]
    assert started[0] in readme  # the handler
    assert started[1] in readme  # the five commands


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    with LocalStack(moto=True, log_dir=tmp_path / "logs") as stack:
        env = {
            **os.environ,
            **stack.env(),
            "SHARDFLOW_STATE_DIR": str(tmp_path / "state"),
            "PATH": f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
        for index, block in enumerate(_to_run(page)):
            if block.kind == "file":
                (workdir / block.argument).write_text(block.text)
                continue
            _run(block, index, env, workdir)


def _command(block: DocBlock, index: int, workdir: Path) -> list[str]:
    if block.language == "python":
        script = workdir / f"block_{index}.py"
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
