"""Dead letters: records that failed, stored with their origin and error, and replayed later.

Public API: :class:`DeadLetter` (the letter and its stable JSON encoding),
:class:`DeadLetterDestination` (the interface), :class:`JsonLinesDestination`,
:class:`KinesisDestination`, and replay (:class:`DeadLetterSource`, :func:`read_letters`,
:class:`LetterFilter`, :func:`replay`, :class:`ReplaySummary`, :class:`ReplayJournal`).
"""

from shardflow.deadletter.destination import DeadLetterDestination
from shardflow.deadletter.journal import ReplayJournal
from shardflow.deadletter.jsonl import JsonLinesDestination, read_json_lines
from shardflow.deadletter.kinesis import KinesisDestination
from shardflow.deadletter.model import DEAD_LETTER_VERSION, DeadLetter
from shardflow.deadletter.replay import (
    DeadLetterSource,
    LetterFilter,
    ReplaySummary,
    read_letters,
    replay,
)

__all__ = [
    "DEAD_LETTER_VERSION",
    "DeadLetter",
    "DeadLetterDestination",
    "DeadLetterSource",
    "JsonLinesDestination",
    "KinesisDestination",
    "LetterFilter",
    "ReplayJournal",
    "ReplaySummary",
    "read_json_lines",
    "read_letters",
    "replay",
]
