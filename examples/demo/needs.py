"""What the demo needs beyond ``pip install shardflow``, said in one line before it starts.

The Spark pipeline needs pyspark (the ``spark`` extra), moto's server (``local``), Java for
Spark, and Node.js with npm for kinesalite (fetched into the user cache on first use);
``--foundation`` needs only moto's server.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path


def missing(*, spark: bool) -> str | None:
    """One line naming what is missing and how to get it, or None when all is there."""
    modules = {"moto": "local", "flask": "local"}
    if spark:
        modules |= {"pyspark": "spark", "pyarrow": "spark"}
    extras = sorted({extra for module, extra in modules.items() if not _importable(module)})
    if extras:
        return (
            f"the demo needs the {' and '.join(extras)} extra(s): "
            f"pip install 'shardflow[{','.join(extras)}]'"
        )
    if spark and not _java():
        return "the demo runs Spark, which needs Java 17: put `java` on PATH or set JAVA_HOME"
    if spark and (shutil.which("node") is None or shutil.which("npm") is None):
        return "the demo runs kinesalite, which needs Node.js >= 18 with npm on PATH"
    return None


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _java() -> bool:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None
