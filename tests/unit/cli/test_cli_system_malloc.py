"""``shardflow multilang`` executes itself again on glibc's malloc, and its processors get the
environment it was given."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from shardflow.cli.system_malloc import MARKER, use_system_malloc

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
    reason="glibc only",
)


class Executed(Exception):
    def __init__(self, path: str, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(path)
        self.path, self.argv, self.env = path, argv, env


@pytest.fixture
def execve(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(path: str, argv: list[str], env: dict[str, str]) -> Any:
        raise Executed(path, argv, env)

    monkeypatch.setattr(os, "execve", fake)
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv(MARKER, raising=False)


def as_command(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """Make ``shardflow multilang ARGS`` this process's own command line."""
    monkeypatch.setattr(sys, "argv", ["/venv/bin/shardflow", "multilang", *args])
    monkeypatch.setattr(
        sys, "orig_argv", ["/venv/bin/python", "/venv/bin/shardflow", "multilang", *args]
    )


@glibc_only
@pytest.mark.usefixtures("execve")
def test_the_command_is_executed_again_with_pythonmalloc_malloc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_command(monkeypatch, "--properties", "app.properties")
    monkeypatch.setenv("KEEP_ME", "1")
    with pytest.raises(Executed) as executed:
        use_system_malloc()
    assert executed.value.path == sys.executable
    assert executed.value.argv == [
        sys.executable,
        "/venv/bin/shardflow",
        "multilang",
        "--properties",
        "app.properties",
    ]
    assert executed.value.env["PYTHONMALLOC"] == "malloc"
    assert executed.value.env[MARKER] == "1"
    assert executed.value.env["KEEP_ME"] == "1"


@pytest.mark.usefixtures("execve")
def test_the_process_so_started_puts_the_environment_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    as_command(monkeypatch, "app.properties")
    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    monkeypatch.setenv(MARKER, "1")
    use_system_malloc()  # returns: no second execution
    assert "PYTHONMALLOC" not in os.environ
    assert MARKER not in os.environ


@pytest.mark.usefixtures("execve")
def test_a_pythonmalloc_the_user_set_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    as_command(monkeypatch, "app.properties")
    monkeypatch.setenv("PYTHONMALLOC", "pymalloc_debug")
    use_system_malloc()
    assert os.environ["PYTHONMALLOC"] == "pymalloc_debug"


@pytest.mark.usefixtures("execve")
def test_main_called_in_process_is_not_executed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # sys.argv set by a caller (a test), not this process's command line (pytest's)
    monkeypatch.setattr(sys, "argv", ["shardflow", "multilang", "app.properties"])
    use_system_malloc()
    assert "PYTHONMALLOC" not in os.environ
