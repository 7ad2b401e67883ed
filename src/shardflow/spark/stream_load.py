"""``spark.readStream.format("shardflow")...load()`` checks its options in the driver, at once.

Spark asks a Python data source for its schema when a read is defined (``.load()``), but does
not say whether it is ``read`` or ``readStream``: what only a streaming read needs
(``metadataPath``; no ``endingPosition``) would be found only when the query starts, as a
``StreamingQueryException`` from ``awaitTermination()``. :func:`check_stream_loads` makes the
stream reader of a session remember the format and options it is given and parse them at
``.load()`` when the format is ``shardflow``, raising
:class:`~shardflow.errors.SparkOptionError` there. It wraps only the public methods ``format``,
``option``, ``options`` and ``load``, once per reader class (classic and Spark Connect), and
changes nothing for other formats; where it cannot follow a reader, the query's start still
checks everything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

FORMAT = "shardflow"
_WRAPPED = "_shardflow_checks_loads"
_GIVEN = "_shardflow_given"


def check_stream_loads(reader_class: type) -> None:
    """Wrap ``reader_class`` (a ``DataStreamReader``) so that its ``load`` checks shardflow's
    options; a second call does nothing."""
    if reader_class.__dict__.get(_WRAPPED):
        return
    methods = ("format", "option", "options", "load")
    if not all(callable(getattr(reader_class, name, None)) for name in methods):
        return  # not the reader this was written for: the query's start checks the options
    original: dict[str, Callable[..., Any]] = {
        name: getattr(reader_class, name) for name in methods
    }

    def given(reader: Any) -> dict[str, Any]:
        state = getattr(reader, "__dict__", {})  # a reader without one is not followed
        found: dict[str, Any] = state.setdefault(_GIVEN, {"format": None, "options": {}})
        return found

    @functools.wraps(original["format"])
    def format(self: Any, source: str) -> Any:
        given(self)["format"] = source
        return original["format"](self, source)

    @functools.wraps(original["option"])
    def option(self: Any, key: str, value: Any) -> Any:
        _remember(given(self)["options"], {key: value})
        return original["option"](self, key, value)

    @functools.wraps(original["options"])
    def options(self: Any, **values: Any) -> Any:
        _remember(given(self)["options"], values)
        return original["options"](self, **values)

    @functools.wraps(original["load"])
    def load(
        self: Any, path: str | None = None, format: str | None = None, *args: Any, **values: Any
    ) -> Any:
        recorded = given(self)
        source = format or recorded["format"]
        if isinstance(source, str) and source.lower() == FORMAT:
            merged = dict(recorded["options"])
            _remember(merged, values)
            if path is not None:
                merged["path"] = path
            from shardflow.spark.source.options import parse_options

            parse_options(merged, streaming=True)
        return original["load"](self, path, format, *args, **values)

    for name, wrapper in (("format", format), ("option", option), ("options", options)):
        setattr(reader_class, name, wrapper)
    reader_class.load = load  # type: ignore[attr-defined]
    setattr(reader_class, _WRAPPED, True)


def _remember(into: dict[str, str], values: dict[str, Any]) -> None:
    """Options as Spark passes them on: text, booleans lower-cased, None left out."""
    for key, value in values.items():
        if value is None:
            continue
        into[key] = str(value).lower() if isinstance(value, bool) else str(value)
