"""Option names and values shared by the source and the sink: known names, numbers and flags.

Spark hands every option over as a string. Each value helper returns None for an option that
is not given (or blank), so that the caller's default applies, and raises
:class:`~shardflow.errors.SparkOptionError` naming the option for a value it cannot take.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import TypeVar

from shardflow.errors import SparkOptionError, UnknownSparkOptionError
from shardflow.spark.connection import lookup

T = TypeVar("T")
N = TypeVar("N", int, float)

_FLAGS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parsed(
    options: Mapping[str, str], name: str, parse: Callable[[str], T], expected: str
) -> T | None:
    text = lookup(options, name)
    if text is None or not text.strip():
        return None
    try:
        return parse(text.strip())
    except (ValueError, KeyError):
        raise SparkOptionError(name, f"expected {expected}, got {text!r}") from None


def _positive(
    name: str, value: N | None, *, allow_zero: bool = False, finite: bool = False
) -> N | None:
    if value is not None and (
        not (value >= 0 if allow_zero else value > 0) or (finite and math.isinf(value))
    ):
        raise SparkOptionError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return value


def number(
    options: Mapping[str, str],
    name: str,
    *,
    unit: str = "",
    allow_zero: bool = False,
    finite: bool = False,
) -> float | None:
    """A number > 0 (>= 0 with ``allow_zero``; not infinite with ``finite``); ``unit``
    completes the message, as in "expected a number of seconds"."""
    value = _parsed(options, name, float, f"a number{unit}")
    return _positive(name, value, allow_zero=allow_zero, finite=finite)


def whole_number(options: Mapping[str, str], name: str) -> int | None:
    """A whole number > 0."""
    return _positive(name, _parsed(options, name, int, "a whole number"))


def flag(options: Mapping[str, str], name: str) -> bool | None:
    """true/false (also 1/0, yes/no), in any case."""
    return _parsed(options, name, lambda text: _FLAGS[text.lower()], "true or false")


def reject_unknown(
    options: Mapping[str, str],
    known: tuple[str, ...],
    *,
    where: str,
    spark_adds: tuple[str, ...] = (),
) -> None:
    """Raise :class:`~shardflow.errors.UnknownSparkOptionError` for the first option not in
    ``known`` (names compare case-insensitively, as Spark lower-cases them), naming the known
    option closest to it: a misspelt option would otherwise be ignored and its default used.
    ``spark_adds`` are options Spark itself passes along (``checkpointLocation`` to a sink)."""
    by_lower = {name.lower(): name for name in known}
    allowed = by_lower.keys() | {name.lower() for name in spark_adds}
    for given in options:
        if given.lower() in allowed:
            continue
        close = difflib.get_close_matches(given.lower(), list(by_lower), n=1, cutoff=0.6)
        raise UnknownSparkOptionError(
            given, where=where, closest=by_lower[close[0]] if close else None, known=known
        )
