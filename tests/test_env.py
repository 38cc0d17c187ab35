"""Every ``ARGUS_*`` environment variable is named once, in ``argus/env.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import argus
from argus import env as argus_env

PACKAGE = Path(argus.__file__).resolve().parent
#: Files allowed to spell a variable out, and why.
EXEMPT = {
    PACKAGE / "env.py": "the one place",
    # runs in every Python process of a traced job: when disabled it must import nothing of Argus
    PACKAGE / "producer" / "_inject" / "sitecustomize.py": "ARGUS_ENABLE before any import",
}


def _exported_names(tree: ast.AST) -> set[int]:
    """ids of the string nodes listed in ``__all__``: Python names (``ARGUS_ARG``), not variables."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out.update(id(n) for n in ast.walk(node.value))
    return out


def _env_literals(source: str, where: str) -> list[str]:
    """``where:line: 'ARGUS_…'`` for each string literal that spells out a variable."""
    tree = ast.parse(source, where)
    exported = _exported_names(tree)
    return [f"{where}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("ARGUS_")
            and id(node) not in exported]


def test_no_environment_variable_is_spelled_outside_env_py() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in EXEMPT
             for hit in _env_literals(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "use the constant from argus/env.py instead of:\n" + "\n".join(found)


def test_the_search_sees_a_spelled_out_variable() -> None:
    source = ('import os\n__all__ = ["ARGUS_ARG"]\nHOST = os.environ.get("ARGUS_HOST")\n'
              'MESSAGE = f"ARGUS_LAYOUT is {HOST}"  # an f-string\nDOC = "set ARGUS_FORCE=1"  # prose, not a name\n')
    assert _env_literals(source, "x.py") == ["x.py:3: 'ARGUS_HOST'", "x.py:4: 'ARGUS_LAYOUT is '"]


def test_each_constant_is_its_own_variable_name() -> None:
    names = {name: getattr(argus_env, name) for name in argus_env.__all__}
    assert all(value == f"ARGUS_{name}" for name, value in names.items()), names
    assert len(set(names.values())) == len(names)
    assert {n for n in dir(argus_env) if n.isupper()} == set(argus_env.__all__)


def test_the_sitecustomize_exception_still_names_enable() -> None:
    text = (PACKAGE / "producer" / "_inject" / "sitecustomize.py").read_text()
    assert f'os.environ.get("{argus_env.ENABLE}"' in text
