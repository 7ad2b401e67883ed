"""A Java ``.properties`` file read as ``java.util.Properties.load(InputStream)`` reads it.

The MultiLangDaemon hands its file to that method, so a file that works there must mean the same
here: ISO-8859-1 bytes, ``\\uXXXX`` escapes for anything else; ``key = value``, ``key: value``
or ``key value``; ``#`` and ``!`` comments; a line ending in an odd number of backslashes goes
on on the next line (whose leading blanks are dropped); ``\\t \\n \\r \\f`` escapes, any other
escaped character stands for itself; leading blanks of a value are dropped, trailing ones kept.
A key given twice keeps its last value (the KCL's Properties is a hash table: the last ``put``
wins). The only malformed input is a broken ``\\uXXXX`` escape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardflow.multilang.errors import PropertiesError

_BLANKS: Final = " \t\f"
_NATURAL_LINES: Final = re.compile(r"\r\n|\r|\n")
_ESCAPED: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


@dataclass(frozen=True, slots=True)
class Property:
    """One ``key = value`` of the file; ``line`` is where its logical line starts (1-based)."""

    key: str
    value: str
    line: int


def read_properties(path: Path | str) -> list[Property]:
    """The properties of the file at ``path``, last occurrence of each key, in file order."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PropertiesError(f"cannot read the properties file {str(path)!r}: {exc}") from None
    return parse_properties(raw.decode("iso-8859-1"))


def parse_properties(text: str) -> list[Property]:
    """The properties of ``text`` (a whole file), last occurrence of each key, in file order."""
    found: dict[str, Property] = {}
    for number, line in _logical_lines(text):
        key, value = _split(line, number)
        found.pop(key, None)  # file order of the occurrence that counts
        found[key] = Property(key, value, number)
    return list(found.values())


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(number of the first natural line, text) of every line that is not blank or a comment,
    continuations joined and their trailing backslash removed."""
    natural = _NATURAL_LINES.split(text)
    logical: list[tuple[int, str]] = []
    index = 0
    while index < len(natural):
        number = index + 1
        line = natural[index].lstrip(_BLANKS)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if index >= len(natural):
                break
            line += natural[index].lstrip(_BLANKS)
            index += 1
        logical.append((number, line))
    return logical


def _continues(line: str) -> bool:
    """Whether ``line`` ends in an odd number of backslashes (the last one escapes the end)."""
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str, number: int) -> tuple[str, str]:
    """The key and value of a logical line, unescaped."""
    end = len(line)
    key_end = end
    value_start = end
    has_separator = False
    backslash = False
    for position, char in enumerate(line):
        if not backslash and char in "=:":
            key_end, value_start, has_separator = position, position + 1, True
            break
        if not backslash and char in _BLANKS:
            key_end, value_start = position, position + 1
            break
        backslash = not backslash if char == "\\" else False
    while value_start < end:
        char = line[value_start]
        if char not in _BLANKS:
            if has_separator or char not in "=:":
                break
            has_separator = True
        value_start += 1
    return _unescape(line[:key_end], number), _unescape(line[value_start:], number)


def _unescape(text: str, number: int) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index, end = 0, len(text)
    while index < end:
        char = text[index]
        index += 1
        if char != "\\" or index >= end:
            out.append(char)
            continue
        char = text[index]
        index += 1
        if char == "u":
            digits = text[index : index + 4]
            if len(digits) < 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise PropertiesError(f"malformed \\uxxxx escape on line {number}")
            out.append(chr(int(digits, 16)))
            index += 4
        else:
            out.append(_ESCAPED.get(char, char))
    return "".join(out)
