"""The package's layers point one way: faces -> loop -> roles -> infrastructure, and no circles.

Every import of every module is read with ``ast`` (imports under ``if TYPE_CHECKING:`` and inside
functions included, since a lazy import is still a dependency), resolved to a module of the
package, and checked against the layer order. A circle between modules, at any length, fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the repository's folders and the names they are installed and imported under
PACKAGES = {"agents": "agentmend", "infrastructure": "agentmend.infrastructure"}

# a lower rank may never import a higher one
LAYERS: tuple[tuple[str, int], ...] = (
    ("agentmend.infrastructure", 0),
    ("agentmend.roles", 1),
    ("agentmend.loop", 2),
    ("agentmend.faces", 3),
)
# the package's own front doors: the lazy public surface and the ``python -m`` shims
FRONT_DOORS = 4


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def _modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[_module_name(path, root)] = path
    return found


def _rank(module: str) -> int:
    best, rank = -1, FRONT_DOORS
    for prefix, layer in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
            best, rank = len(prefix), layer
    return rank


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module an import refers to (``a.b.c`` may name an attribute of ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every package module that ``module`` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    # the lazy surface maps names to modules in strings: count those too
    if module in PACKAGES.values():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in modules
            ):
                found.add(node.value)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if _rank(source) < _rank(target)
    )


def _is_ancestor_package(source: str, target: str) -> bool:
    # importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: a package's own
    # ``__init__`` importing its submodule is not a circle of the code's making
    return target.startswith(source + ".") or source.startswith(target + ".")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    edges = {
        source: {t for t in targets if not _is_ancestor_package(source, t)}
        for source, targets in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def test_no_import_runs_upward() -> None:
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_circle() -> None:
    assert import_cycles(import_graph(ROOT)) == []


def _copy_package(tmp_path: Path) -> Path:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    return tmp_path


@pytest.mark.parametrize(
    ("module", "statement", "expected"),
    [
        (
            "infrastructure/store.py",
            "\nif False:\n    from agentmend.roles.team import AgentTeam\n",
            "agentmend.infrastructure.store -> agentmend.roles.team",
        ),
        (
            "agents/roles/team.py",
            "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from agentmend.loop.cycle import CycleResult\n",
            "agentmend.roles.team -> agentmend.loop.cycle",
        ),
        (
            "agents/loop/cycle.py",
            "\ndef _late() -> None:\n    from agentmend.faces import workspace\n",
            "agentmend.loop.cycle -> agentmend.faces.workspace",
        ),
    ],
)
def test_an_injected_upward_import_is_caught(
    tmp_path: Path, module: str, statement: str, expected: str
) -> None:
    root = _copy_package(tmp_path)
    with (root / module).open("a", encoding="utf-8") as handle:
        handle.write(statement)
    assert expected in upward_imports(import_graph(root))


def test_an_injected_circle_is_caught(tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    # store.py imports errors.py; make errors.py import store.py back, lazily
    with (root / "infrastructure/errors.py").open("a", encoding="utf-8") as handle:
        handle.write(
            "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from agentmend.infrastructure.store import Store\n"
        )
    cycles = import_cycles(import_graph(root))
    assert any(
        {"agentmend.infrastructure.errors", "agentmend.infrastructure.store"} <= set(c)
        for c in cycles
    )
