"""No function in panm_hf is over 80 lines (issue 37: a function a screen long), measured with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "panm_hf"
LIMIT = 80


def _functions(path: Path):
    """(qualified name, lines) of every function and method in `path`."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(ast.parse(path.read_text()), "")


def test_no_function_in_panm_hf_is_over_80_lines():
    long = {
        (str(path.relative_to(PACKAGE)), name): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, lines in _functions(path)
        if lines > LIMIT
    }
    assert not long, long
    assert len(list(PACKAGE.rglob("*.py"))) > 20  # the walk found the package
