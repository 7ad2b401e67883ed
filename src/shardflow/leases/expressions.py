"""Lease writes rendered as DynamoDB request parameters (condition and update expressions)."""

from __future__ import annotations

from typing import Any

from shardflow.leases.model import AttributeValue
from shardflow.leases.writes import Absent, Action, Add, Condition, Equals, Exists, Put, Remove


class _Placeholders:
    """Names every attribute and value through placeholders (``#a0``, ``:v0``).

    Placeholders keep attribute names safe from DynamoDB's reserved words.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, AttributeValue] = {}

    def name(self, attribute: str) -> str:
        for placeholder, known in self.names.items():
            if known == attribute:
                return placeholder
        placeholder = f"#a{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def value(self, value: AttributeValue) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = value
        return placeholder


def _condition(condition: Condition, ph: _Placeholders) -> str:
    name = ph.name(condition.attribute)
    if isinstance(condition, Equals):
        return f"{name} = {ph.value(condition.value)}"
    if isinstance(condition, Exists):
        return f"attribute_exists({name})"
    if isinstance(condition, Absent):
        return f"attribute_not_exists({name})"
    raise TypeError(f"unknown condition {condition!r}")


def _update(actions: tuple[Action, ...], ph: _Placeholders) -> str:
    sets: list[str] = []
    removes: list[str] = []
    adds: list[str] = []
    for action in actions:
        name = ph.name(action.attribute)
        if isinstance(action, Put):
            sets.append(f"{name} = {ph.value(action.value)}")
        elif isinstance(action, Remove):
            removes.append(name)
        elif isinstance(action, Add):
            adds.append(f"{name} {ph.value({'N': str(action.amount)})}")
        else:
            raise TypeError(f"unknown action {action!r}")
    clauses = [
        f"{verb} {', '.join(parts)}"
        for verb, parts in (("SET", sets), ("REMOVE", removes), ("ADD", adds))
        if parts
    ]
    return " ".join(clauses)


def render(conditions: tuple[Condition, ...], actions: tuple[Action, ...] = ()) -> dict[str, Any]:
    """``ConditionExpression``, ``UpdateExpression`` (if any actions) and their placeholder maps."""
    ph = _Placeholders()
    params: dict[str, Any] = {}
    if actions:
        params["UpdateExpression"] = _update(actions, ph)
    if conditions:
        params["ConditionExpression"] = " AND ".join(_condition(c, ph) for c in conditions)
    if ph.names:
        params["ExpressionAttributeNames"] = ph.names
    if ph.values:
        params["ExpressionAttributeValues"] = ph.values
    return params
