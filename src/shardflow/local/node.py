"""Finding Node.js, the npm emulator packages and the loopback preload script."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from shardflow.errors import EmulatorNotInstalledError, NodeModulesNotFoundError

#: Set to a ``node_modules`` directory to use it instead of searching for one.
NODE_MODULES_ENV = "SHARDFLOW_NODE_MODULES"

_INSTALL_HINT = "run `make setup` (or `npm ci`) in the shardflow checkout"


def node_executable() -> str:
    """The path of ``node`` on PATH."""
    found = shutil.which("node")
    if found is None:
        raise EmulatorNotInstalledError(
            f"Node.js (>= 18) is needed for kinesis-local and kinesalite but `node` is not on PATH; "
            f"install it, then {_INSTALL_HINT}"
        )
    return found


def loopback_preload() -> Path:
    """The script given to ``node -r`` that makes every TCP server listen on 127.0.0.1 only."""
    return Path(__file__).with_name("loopback.js")


def find_package(package: str, *, start: Path | None = None) -> Path:
    """The directory of an installed npm package, e.g. ``.../node_modules/kinesalite``.

    Looks in ``$SHARDFLOW_NODE_MODULES`` when set; otherwise in every ``node_modules`` found by
    walking up from ``start`` (default: the current directory) and then from this package's
    own location (a source checkout installed in editable mode).
    """
    override = os.environ.get(NODE_MODULES_ENV)
    candidates = [Path(override)] if override else list(_node_modules_dirs(start))
    for node_modules in candidates:
        package_dir = node_modules / package
        if (package_dir / "package.json").is_file():
            return package_dir.resolve()
    where = (
        f"{NODE_MODULES_ENV}={override}"
        if override
        else "node_modules above the current directory or the shardflow package"
    )
    raise NodeModulesNotFoundError(
        f"npm package {package!r} not found in {where}; {_INSTALL_HINT}"
        + ("" if override else f", or set {NODE_MODULES_ENV} to a node_modules directory")
    )


def _node_modules_dirs(start: Path | None) -> Iterator[Path]:
    seen: set[Path] = set()
    for origin in (start or Path.cwd(), Path(__file__).parent):
        for directory in (origin.resolve(), *origin.resolve().parents):
            candidate = directory / "node_modules"
            if candidate not in seen:
                seen.add(candidate)
                yield candidate
