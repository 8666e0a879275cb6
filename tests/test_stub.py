"""The native module implements exactly the contract in ``yirage/_core.pyi``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import yirage
from yirage import _core

STUB = Path(yirage.__file__).with_name("_core.pyi")


def _stub_names() -> tuple[set[str], dict[str, set[str]]]:
    tree = ast.parse(STUB.read_text(encoding="utf-8"))
    top: set[str] = set()
    members: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            } - {"__init__", "__new__"}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    return top, members


def test_stub_file_ships_with_the_package() -> None:
    assert STUB.is_file()


def test_module_matches_stub() -> None:
    top, members = _stub_names()
    public = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    assert public == top, f"only in module: {public - top}; only in stub: {top - public}"
    for cls, names in members.items():
        obj = getattr(_core, cls)
        assert inspect.isclass(obj)
        have = {n for n in dir(obj) if not n.startswith("_")}
        if issubclass(obj, BaseException):
            continue  # exception classes carry BaseException's members
        assert names == have, f"{cls}: only in module: {have - names}; only in stub: {names - have}"
    assert isinstance(_core.__version__, str)


def test_exception_hierarchy_matches_stub() -> None:
    for name in (
        "ShapeError",
        "DTypeError",
        "GraphError",
        "MappingError",
        "SerializationError",
        "EvaluationError",
    ):
        assert issubclass(getattr(_core, name), _core.YirageError)
