"""Finding Node.js, the npm emulator packages and the loopback preload script.

A source checkout has the emulators in its ``node_modules`` (``make setup``). A pip install
has none: on first use the pinned package is fetched with npm into this user's cache
(``$SHARDFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardflow``, else ``~/.cache/shardflow``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from shardflow.errors import EmulatorNotInstalledError, NodeModulesNotFoundError
from shardflow.local.user_dirs import user_cache_dir

#: Set to a ``node_modules`` directory to use it instead of searching for one.
NODE_MODULES_ENV = "SHARDFLOW_NODE_MODULES"
#: The emulator versions shardflow is tested with (as pinned in the checkout's package.json).
NPM_PACKAGES = {"kinesis-local": "0.6.2", "kinesalite": "3.3.3", "dynalite": "4.0.0"}

_NODE_HINT = "install Node.js >= 18 with npm (https://nodejs.org)"


def node_executable() -> str:
    """The path of ``node`` on PATH."""
    found = shutil.which("node")
    if found is None:
        raise EmulatorNotInstalledError(
            f"Node.js (>= 18) is needed for kinesis-local and kinesalite but `node` is not on PATH; "
            f"{_NODE_HINT}"
        )
    return found


def loopback_preload() -> Path:
    """The script given to ``node -r`` that makes every TCP server listen on 127.0.0.1 only."""
    return Path(__file__).with_name("loopback.js")


def find_package(package: str, *, start: Path | None = None) -> Path:
    """The directory of an installed npm package, e.g. ``.../node_modules/kinesalite``.

    Looks in ``$SHARDFLOW_NODE_MODULES`` when set (and only there); otherwise in every
    ``node_modules`` found by walking up from ``start`` (default: the current directory) and
    from this package's own location (a source checkout), then in the user cache, where a
    missing emulator is fetched with npm on first use.
    """
    override = os.environ.get(NODE_MODULES_ENV)
    if override:
        found = _package_in([Path(override)], package)
        if found is None:
            raise NodeModulesNotFoundError(
                f"npm package {package!r} not found in {NODE_MODULES_ENV}={override}; "
                f"run `npm ci` in the shardflow checkout or unset {NODE_MODULES_ENV}"
            )
        return found
    cache = user_cache_dir() / "node"
    found = _package_in([*_node_modules_dirs(start), cache / "node_modules"], package)
    return found if found is not None else fetch_package(package, cache)


def fetch_package(package: str, prefix: Path) -> Path:
    """Install the pinned version of ``package`` under ``prefix`` with npm; its directory."""
    version = NPM_PACKAGES.get(package)
    if version is None:
        raise NodeModulesNotFoundError(f"no pinned version of the npm package {package!r}")
    command = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund"]
    command += ["--prefer-offline", "--loglevel=error", f"{package}@{version}"]
    shown = " ".join(command)
    npm = shutil.which("npm")
    if npm is None:
        raise NodeModulesNotFoundError(
            f"the emulator {package} comes from npm, which is not on PATH; {_NODE_HINT}, "
            f"then run: {shown}"
        )
    print(
        f"shardflow: fetching {package}@{version} from npm into {prefix} (first use only)",
        file=sys.stderr,
        flush=True,
    )
    prefix.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            [npm, *command[1:]], capture_output=True, text=True, timeout=600, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NodeModulesNotFoundError(f"{shown} failed: {error}") from error
    found = _package_in([prefix / "node_modules"], package)
    if done.returncode != 0 or found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise NodeModulesNotFoundError(f"{shown} failed: {' / '.join(tail) or done.returncode}")
    return found


def _package_in(candidates: list[Path], package: str) -> Path | None:
    for node_modules in candidates:
        package_dir = node_modules / package
        if (package_dir / "package.json").is_file():
            return package_dir.resolve()
    return None


def _node_modules_dirs(start: Path | None) -> Iterator[Path]:
    seen: set[Path] = set()
    for origin in (start or Path.cwd(), Path(__file__).parent):
        for directory in (origin.resolve(), *origin.resolve().parents):
            candidate = directory / "node_modules"
            if candidate not in seen:
                seen.add(candidate)
                yield candidate
