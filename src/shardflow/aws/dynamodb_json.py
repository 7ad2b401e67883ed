"""DynamoDB's item answers (Scan, GetItem, UpdateItem, PutItem, DeleteItem) read in one pass.

A lease table is scanned whole by every worker (each take cycle, and several times a second
when lease pick-up polls), and botocore reads each answer by walking its output shape value by
value: for a 1,000-lease table that walk, on the stdlib ``json`` decoder, was most of an idle
consumer's CPU (bench/consumer.py's scale part, profiled). An item is already typed JSON
(``{"name": {"S": "..."}}``) and botocore changes only binary values (base64 to bytes), so
this reads the body with orjson and decodes ``B`` / ``BS`` values itself.

Only a body it fully understands is read here: an answer with a member it does not handle
(``ConsumedCapacity``, ``ItemCollectionMetrics``), an attribute value that is not one of
DynamoDB's ten types, or anything malformed raises ``ValueError`` and goes to botocore's parser
(see :class:`~shardflow.aws.kinesis_json.KinesisParser`, which dispatches to it).
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson

_OUTPUTS = {
    # output shape -> (members holding one item, members holding a list of items, counts)
    "ScanOutput": (frozenset({"LastEvaluatedKey"}), frozenset({"Items"})),
    "GetItemOutput": (frozenset({"Item"}), frozenset()),
    "UpdateItemOutput": (frozenset({"Attributes"}), frozenset()),
    "PutItemOutput": (frozenset({"Attributes"}), frozenset()),
    "DeleteItemOutput": (frozenset({"Attributes"}), frozenset()),
}
_COUNTS = frozenset({"Count", "ScannedCount"})
_STRINGS = frozenset({"S", "N"})
_STRING_SETS = frozenset({"SS", "NS"})
_FLAGS = frozenset({"BOOL", "NULL"})


def dynamodb_output(shape: Any) -> str | None:
    """The output shape's name if it is one of the item answers read here (checked by the
    shape of its items, so another service's same-named output is not taken for it)."""
    if shape is None or shape.name not in _OUTPUTS:
        return None
    singles, lists = _OUTPUTS[shape.name]
    for name in singles:
        member = shape.members.get(name)
        if member is None or member.type_name != "map":
            return None
    for name in lists:
        member = shape.members.get(name)
        if member is None or member.type_name != "list" or member.member.type_name != "map":
            return None
    return str(shape.name)


def parse_item_output(body: bytes, output: str) -> dict[str, Any]:
    """The parsed body of a successful ``output`` answer, as botocore would return it.
    Raises ``ValueError`` (or ``TypeError``, ``binascii.Error``) for anything else."""
    raw = orjson.loads(body)
    if type(raw) is not dict:
        raise ValueError("not a JSON object")
    singles, lists = _OUTPUTS[output]
    parsed: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None:
            continue  # botocore drops nulls
        if name in singles:
            parsed[name] = _item(value)
        elif name in lists:
            if type(value) is not list:
                raise ValueError(f"{name} is not a list")
            parsed[name] = [_item(item) for item in value]
        elif name in _COUNTS and output == "ScanOutput":
            if type(value) is not int:
                raise ValueError(f"{name} is not an integer")
            parsed[name] = value
        else:
            raise ValueError(f"member {name} is left to botocore")
    return parsed


def _item(raw: Any) -> dict[str, Any]:
    """An attribute map as botocore gives it: binary values decoded, the rest as they are."""
    if type(raw) is not dict:
        raise ValueError("an item is not a JSON object")
    for name, value in raw.items():
        decoded = _value(value)
        if decoded is not value:
            raw[name] = decoded
    return raw


def _value(value: Any) -> Any:
    if type(value) is not dict or len(value) != 1:
        raise ValueError("an attribute value is not a one-member object")
    ((kind, inner),) = value.items()
    if kind in _STRINGS:
        if type(inner) is not str:
            raise ValueError(f"{kind} is not a string")
        return value
    if kind in _STRING_SETS:
        if type(inner) is not list or any(type(one) is not str for one in inner):
            raise ValueError(f"{kind} is not a list of strings")
        return value
    if kind in _FLAGS:
        if type(inner) is not bool:
            raise ValueError(f"{kind} is not a boolean")
        return value
    if kind == "B":
        return {"B": _binary(inner)}
    if kind == "BS":
        if type(inner) is not list:
            raise ValueError("BS is not a list")
        return {"BS": [_binary(one) for one in inner]}
    if kind == "M":
        return {"M": _item(inner)}
    if kind == "L":
        if type(inner) is not list:
            raise ValueError("L is not a list")
        return {"L": [_value(one) for one in inner]}
    raise ValueError(f"unknown attribute type {kind}")


def _binary(raw: Any) -> bytes:
    if type(raw) is not str:
        raise ValueError("a binary value is not base64 text")
    return binascii.a2b_base64(raw)
