"""No import circle among the meta package's modules.

Every module under ``packages/yirage/python/yirage`` is parsed with ``ast`` (nothing is
imported), and every ``import yirage...`` / ``from yirage... import ...`` in it, at module
level or inside a function, is an edge to the module it loads:

- ``from yirage.a import b`` is an edge to ``yirage.a.b`` when that is a module, else to
  ``yirage.a`` (``b`` is a name defined there); ``import yirage`` and ``from yirage import
  __version__`` are edges to the package's ``__init__``;
- relative imports are resolved against the importing module's package;
- imports under ``if TYPE_CHECKING:`` are left out: they never run, and annotations need
  the types they name on both sides of a dependency;
- a native module (``yirage._core``) is a module too, known by its ``.pyi`` stub;
- the implicit import of a parent package (Python runs ``yirage/__init__.py`` before any
  ``yirage._x``) is left out too: it holds for every module alike.

The graph must be acyclic; a failure names one circle per strongly connected component.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "packages" / "yirage" / "python" / "yirage"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module by name; a native module (``yirage._core``) by its ``.pyi`` stub."""
    mods = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.pyi"))}
    mods.update({_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))})
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    """The yirage modules one import statement loads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module name → the yirage modules it imports at run time."""
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            edges |= _targets(name, is_package, node, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _circle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One circle through the component's first module: a → b → … → a."""
    start, members = comp[0], set(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return comp  # unreachable for a strongly connected component


def test_the_meta_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert {"yirage._superoptimize", "yirage._bench._harness", "yirage._core"} <= set(graph)
    circles = [" → ".join(_circle(graph, c)) for c in _components(graph)]
    assert not circles, "import circles in the meta package:\n" + "\n".join(circles)


def test_the_graph_sees_function_level_and_relative_imports_but_not_type_checking(
    tmp_path: Path,
) -> None:
    """The parser itself: an import inside a function is an edge, a relative one resolves
    against the package, an ``if TYPE_CHECKING:`` one is no edge; and a circle is found and
    named."""
    known = {"yirage", "yirage.a", "yirage.b", "yirage.sub", "yirage.sub.c"}
    src = (
        "from typing import TYPE_CHECKING\n"
        "from yirage import b\n"
        "if TYPE_CHECKING:\n"
        "    from yirage.sub import c\n"
        "def f():\n"
        "    from .sub import c\n"
        "    from yirage import __version__\n"
    )
    edges: set[str] = set()
    for node in _runtime_imports(ast.parse(src)):
        edges |= _targets("yirage.a", False, node, known)
    assert edges == {"yirage.b", "yirage.sub.c", "yirage"}
    rel = ast.parse("from . import a\nfrom .. import b\n")
    got: set[str] = set()
    for node in _runtime_imports(rel):
        got |= _targets("yirage.sub", True, node, known)
    assert got == {"yirage.sub", "yirage.b"}  # yirage.sub.a is no module: a name in sub
    graph = {"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}
    (comp,) = _components(graph)
    assert comp == ["x", "y", "z"] and _circle(graph, comp) == ["x", "y", "z", "x"]
