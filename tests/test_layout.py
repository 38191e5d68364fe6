"""The package's shape, checked from its source with `ast`: no import circles among proxy's
modules, no core module that names a wire format, and a package root that stays small."""

from __future__ import annotations

import ast
import time
from functools import cache
from pathlib import Path

from proxy.wire.registry import WIRES

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
WIRE_FORMATS = tuple(wire.name for wire in WIRES)  # the registry's: every format
# Where a format may be named: its own folder, the simulator's dialects, the app's registry.
FORMAT_HOMES = ("proxy.wire", "proxy.sim", "proxy.app")
# Names that are the same word as a format but name something else (a provider, GenAI's
# operation, Codex's own setting), module by module: not a wire.
NOT_A_WIRE = {
    ("proxy.policies.providers", "anthropic"),  # a provider's key variable
    ("proxy.policies.providers", "gemini"),
    ("proxy.tokens.tokenizers", "anthropic"),  # a tokenizer's name
    ("proxy.tracing", "chat"),  # gen_ai.operation.name
    ("proxy.runtime.agent_env", "responses"),  # Codex's wire_api setting
    ("proxy.runtime.agent_env", "gemini"),  # the Gemini CLI's program name
    ("proxy.runtime.run_simulated", "gemini"),  # the Gemini CLI, and its simulated model's alias
    ("proxy.replay.config", "anthropic"),  # the provider whose api_base has no /v1
    ("proxy.messages", "chat"),  # CHAT: the shape every request is rewritten in, named once
}
# The floors of proxy's packages, lowest first: a module imports its own floor or lower ones;
# an import of a higher floor is an arrow that runs back up.
FLOORS = {
    **dict.fromkeys(
        (
            "proxy",
            "errors",
            "logs",
            "redaction",
            "metrics",
            "messages",
            "json_values",
            "request_id",
            "eager",
            "tokens",
            "policies",
        ),
        0,
    ),
    **dict.fromkeys(("exchange", "sessions", "store", "model_catalog", "tracing"), 1),
    # guards beside recording: rate limits record their refusals, and a recording keeps the
    # placeholders of the secrets the guard scrubbed (guards/secrets/recorded.py).
    **dict.fromkeys(("upstream", "recording", "guards"), 2),
    "control": 3,
    "pipeline": 4,
    **dict.fromkeys(("flow", "http", "state"), 5),
    "wire": 6,
    **dict.fromkeys(
        ("routes", "admin", "ui", "runtime", "app", "cli", "replay", "sim", "__main__"),
        7,
    ),
}
UPWARD_LIMIT = 0


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


@cache
def _parse(path: Path) -> ast.Module:
    """A module's tree. CPython 3.11 keeps the AST constructor's recursion count per
    interpreter, so a thread compiling meanwhile (a module imported off the main thread by an
    earlier test) can make a parse fail with "recursion depth mismatch" (gh-106905): parsed
    again, it is what it is."""
    source = path.read_text()
    for _ in range(4):
        try:
            return ast.parse(source, str(path))
        except SystemError:
            time.sleep(0.05)
    return ast.parse(source, str(path))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The proxy modules `name` imports when it loads (a package's import runs its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _top_level_imports(_parse(path)):
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


def test_formats_import_no_other_format_but_chat() -> None:
    """A format's folder stands alone: what two formats share lives in proxy/wire/ itself
    (the model lists' dispatcher, the registry). Chat is every format's common shape."""
    formats = [f"proxy.wire.{name}" for name in WIRE_FORMATS if name != "chat"]
    offenders = {
        name: sorted(t for t in targets if t.startswith(tuple(formats)) and not t.startswith(own))
        for name, targets in _graph().items()
        for own in [".".join(name.split(".")[:3])]
        if name.startswith(("proxy.wire.chat.", *(f"{f}." for f in formats)))
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS[parts[1] if len(parts) > 1 else "proxy"]


def _upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (name, target)
        for name, targets in graph.items()
        for target in targets
        if _floor(name) < _floor(target)
    )


def test_every_package_has_a_floor() -> None:
    assert {name.split(".")[1] for name in _modules() if "." in name} <= set(FLOORS)


def test_few_imports_run_back_up() -> None:
    upward = _upward_imports(_graph())
    assert len(upward) <= UPWARD_LIMIT, upward


def _format_names(path: Path) -> set[str]:
    """The formats a module names: a string equal to one, or an import of a format's module
    (proxy.wire.<format>, proxy.sim.<format>)."""
    found: set[str] = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Constant) and node.value in WIRE_FORMATS:
            found.add(node.value)
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            named = [*parts[2:3], *(a.name for a in node.names)] if parts[1:2] in (
                ["wire"], ["sim"]) else []  # fmt: skip
            found.update(name for name in named if name in WIRE_FORMATS)
    return found


def _modules_naming_a_format() -> dict[str, list[str]]:
    named = {}
    for name, path in _modules().items():
        if any(name == home or name.startswith(home + ".") for home in FORMAT_HOMES):
            continue
        found = sorted(f for f in _format_names(path) if (name, f) not in NOT_A_WIRE)
        if found:
            named[name] = found
    return named


def test_formats_are_named_only_in_their_homes() -> None:
    assert _modules_naming_a_format() == {}


def test_package_root_stays_small() -> None:
    root = sorted(path.name for path in PROXY.glob("*.py"))
    assert len(root) <= ROOT_LIMIT, root


def test_the_checker_sees_a_circle() -> None:
    """The check itself can fail."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_checkers_see_an_upward_import_and_a_named_format(tmp_path: Path) -> None:
    assert _upward_imports({"proxy.errors": {"proxy.flow"}, "proxy.flow": {"proxy.errors"}}) == [
        ("proxy.errors", "proxy.flow")
    ]
    module = tmp_path / "m.py"
    module.write_text('from proxy.sim import anthropic\nWIRE = "responses"\n')
    assert _format_names(module) == {"anthropic", "responses"}
