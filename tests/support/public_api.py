"""The public API's one list, ``shardflow._EXPORTS``, rendered into the import block that type
checkers read (``if TYPE_CHECKING:`` in ``src/shardflow/__init__.py``).

``python tests/support/public_api.py`` rewrites the block after ``_EXPORTS`` changed;
``tests/unit/test_public_api.py`` fails while the two differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

INIT = Path(__file__).resolve().parents[2] / "src" / "shardflow" / "__init__.py"
BEGIN = "if TYPE_CHECKING:  # generated from _EXPORTS by tests/support/public_api.py\n"
END = "\n\n__version__"


def render(exports: dict[str, tuple[str, ...]]) -> str:
    """The block: ``from module import Name as Name`` (an explicit re-export for mypy), one
    import a line, in the order ruff keeps."""
    lines = [BEGIN.rstrip("\n")]
    for module in sorted(exports):
        names = sorted(exports[module], key=lambda name: (name.lower(), name))
        lines.extend(f"    from {module} import {name} as {name}" for name in names)
    return "\n".join(lines)


def imported(text: str) -> set[tuple[str, str]]:
    """(module, name) of every import in the block, however it is formatted."""
    import ast

    block = current_block(text)
    tree = ast.parse(block.replace(BEGIN, "if True:\n", 1))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.update((node.module or "", alias.name) for alias in node.names)
    return found


def current_block(text: str) -> str:
    start = text.index(BEGIN)
    return text[start : text.index(END, start)]


def rewrite() -> bool:
    """Rewrite the block in place (then sorted by ruff, as ``make lint`` wants it); whether the
    names changed."""
    import subprocess

    import shardflow

    text = INIT.read_text()
    wanted = {(module, name) for module, names in shardflow._EXPORTS.items() for name in names}
    if imported(text) == wanted:
        return False
    INIT.write_text(text.replace(current_block(text), render(shardflow._EXPORTS)))
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--fix", "--select", "I", "-q", str(INIT)], check=True)
    subprocess.run([*ruff, "format", "-q", str(INIT)], check=True)
    return True


if __name__ == "__main__":
    sys.path.insert(0, str(INIT.parents[1]))
    print("rewritten" if rewrite() else "up to date")
