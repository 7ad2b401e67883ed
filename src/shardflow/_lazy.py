"""Package attributes imported on first use (PEP 562), for packages whose eager imports would
be slow or circular."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package that imports its exports on first use.

    ``namespace`` is the package's ``globals()`` (with ``__all__``); ``exports`` maps each
    exported name to the module that defines it. A name, once imported, stays in the namespace.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *namespace["__all__"]])

    return __getattr__, __dir__
