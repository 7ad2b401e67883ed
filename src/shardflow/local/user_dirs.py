"""Where the local stack keeps things per user: one rule for its state and its cache.

A variable of shardflow's own wins, then the XDG base directory, then the usual place under
the home directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "SHARDFLOW_STATE_DIR"
CACHE_DIR_ENV = "SHARDFLOW_CACHE_DIR"


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The stack's state: ``$SHARDFLOW_STATE_DIR``, ``$XDG_STATE_HOME/shardflow`` or
    ``~/.local/state/shardflow``."""
    return _user_dir(environ, STATE_DIR_ENV, "XDG_STATE_HOME", Path(".local", "state"))


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Fetched emulators: ``$SHARDFLOW_CACHE_DIR``, ``$XDG_CACHE_HOME/shardflow`` or
    ``~/.cache/shardflow``."""
    return _user_dir(environ, CACHE_DIR_ENV, "XDG_CACHE_HOME", Path(".cache"))


def _user_dir(environ: Mapping[str, str] | None, own: str, xdg: str, under_home: Path) -> Path:
    env = os.environ if environ is None else environ
    if env.get(own):
        return Path(env[own]).expanduser()
    if env.get(xdg):
        return Path(env[xdg]).expanduser() / "shardflow"
    return Path.home() / under_home / "shardflow"
