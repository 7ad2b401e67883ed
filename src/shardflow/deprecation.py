"""Names that moved keep working for one release, with a DeprecationWarning that names the new one.

A module that renamed something sets ``__getattr__ = renamed(__name__, {"Old": "New"})``: the
old name then resolves to the new object on first use and warns once per use site (Python's
default filter). Every such rename is listed in CHANGELOG.md.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def renamed(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving each old name of ``names`` to its new one."""

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is {module}.{new} now; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return __getattr__
