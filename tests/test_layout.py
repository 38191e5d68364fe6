"""The package's shape, checked from its source with `ast`: no import circles among proxy's
modules, no core module that names a wire format, and a package root that stays small."""

from __future__ import annotations

import ast
from pathlib import Path

PROXY = Path(__file__).resolve().parent.parent / "proxy"
ROOT_LIMIT = 22
# Modules that must not know any wire format: the exchange, the flow and the layers under them.
CORE = (
    "proxy.exchange",
    "proxy.flow",
    "proxy.pipeline",
    "proxy.control",
    "proxy.store",
    "proxy.policies",
    "proxy.upstream",
    "proxy.tokens",
)
WIRE_FORMATS = ("chat", "anthropic", "responses")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PROXY.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PROXY.rglob("*.py")}


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """A module's own imports: its body's, those under `if`/`try` and `if TYPE_CHECKING:`
    included (a circle of type-only imports still ties the modules together), those inside
    functions (deferred on purpose) not."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            pending.extend([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            pending.extend([*node.body, *node.orelse, *node.finalbody])
            for handler in node.handlers:
                pending.extend(handler.body)
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The proxy modules `name` imports when it loads (a package's import runs its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _is_package_ancestor(importer: str, imported: str) -> bool:
    """`a.b.c` importing `a.b` runs a.b's __init__, which is already loading: not a circle."""
    return importer.startswith(imported + ".")


def test_no_import_circles() -> None:
    graph = {
        name: {t for t in targets if not _is_package_ancestor(name, t)}
        for name, targets in _graph().items()
    }
    assert _cycles(graph) == []


def test_core_modules_import_no_wire_format() -> None:
    formats = tuple(f"proxy.wire.{name}" for name in WIRE_FORMATS)
    offenders = {
        name: sorted(t for t in targets if t.startswith(formats))
        for name, targets in _graph().items()
        if any(name == core or name.startswith(core + ".") for core in CORE)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_package_root_stays_small() -> None:
    root = sorted(path.name for path in PROXY.glob("*.py"))
    assert len(root) <= ROOT_LIMIT, root


def test_the_checker_sees_a_circle() -> None:
    """The check itself can fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
