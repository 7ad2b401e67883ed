"""errors.py draws its hierarchy in its docstring: the drawing is the classes' real one."""

from __future__ import annotations

import inspect

import shardflow.errors as errors


def drawn() -> list[tuple[int, str]]:
    doc = inspect.getdoc(errors) or ""
    tree = doc.split("::", 1)[1]
    found = []
    for line in tree.splitlines():
        if line.strip():
            depth = (len(line) - len(line.lstrip())) // 4
            found.append((depth, line.split()[0]))
    base = min(depth for depth, _ in found)
    return [(depth - base, name) for depth, name in found]


def test_the_docstring_draws_every_error_class_under_its_parent() -> None:
    lines = drawn()
    classes = {
        name: value
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.ShardflowError)
    }
    assert {name for _, name in lines} == set(classes)
    parents: list[str] = []
    for depth, name in lines:
        del parents[depth:]
        if parents:
            assert classes[name].__bases__[0] is classes[parents[-1]], name
        else:
            assert name == "ShardflowError"
        parents.append(name)
