"""Settings are data a user reads field by field: every field has its own docstring."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap

import pytest

import shardflow
from shardflow import ConsumerSettings, FanOut, Polling
from shardflow.leases.settings import StreamSpec

SETTINGS: list[type] = [
    *(
        getattr(shardflow, name)
        for name in shardflow.__all__
        if name.endswith("Settings") or name in ("Backoff", "FanOut", "Polling", "Idempotency")
    ),
    StreamSpec,
]


def documented_fields(cls: type) -> set[str]:
    """Fields followed by a string literal in the class body (an attribute docstring)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    names = set()
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            names.add(statement.target.id)
    return names


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda cls: cls.__name__)
def test_every_field_has_its_own_docstring(cls: type) -> None:
    fields = {field.name for field in dataclasses.fields(cls)}
    assert fields - documented_fields(cls) == set()


def test_the_fetch_mode_is_a_value_with_its_own_settings() -> None:
    assert isinstance(ConsumerSettings().fetch, Polling)
    fanout = ConsumerSettings(fetch=FanOut(consumer_name="billing-efo")).fetch
    assert isinstance(fanout, FanOut)
    assert fanout.consumer_name == "billing-efo"
    with pytest.raises(TypeError, match="Polling"):
        ConsumerSettings(fetch="efo")  # type: ignore[arg-type]
