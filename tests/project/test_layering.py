"""The package's layers point one way: faces -> loop -> roles -> infrastructure, and no circles.

Every import of every module is read with ``ast`` (imports under ``if TYPE_CHECKING:`` and inside
functions included, since a lazy import is still a dependency), resolved to a module of the
package, and checked against the layer order, which ranks the folders inside ``infrastructure``
and inside ``faces`` too. A circle between modules, at any length, fails too. The tree itself is
held to one concept per folder: at most ``MAX_MODULES`` modules in a folder, and no module named
by its package's name and an underscore (a prefix standing in for a folder).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the repository's folders and the names they are installed and imported under
PACKAGES = {"agents": "agentmend", "infrastructure": "agentmend.infrastructure"}

# a lower rank may never import a higher one; the longest matching prefix gives a module's rank
LAYERS: tuple[tuple[str, int], ...] = (
    # the ground: errors, models, settings, principal, limits, logging, tracing
    ("agentmend.infrastructure", 0),
    ("agentmend.infrastructure.files", 1),
    ("agentmend.infrastructure.store", 2),
    ("agentmend.infrastructure.definitions", 2),
    ("agentmend.infrastructure.llm", 3),
    ("agentmend.infrastructure.monitoring", 3),
    ("agentmend.infrastructure.evaluation", 4),
    ("agentmend.infrastructure.simulation", 4),
    ("agentmend.infrastructure.detection", 4),
    ("agentmend.infrastructure.changes.audit", 5),
    ("agentmend.infrastructure.changes.protocol", 6),
    ("agentmend.infrastructure.changes", 7),
    ("agentmend.infrastructure.code_update", 8),
    ("agentmend.infrastructure.releases", 8),
    ("agentmend.infrastructure.telemetry", 9),
    # whole-store operations: a history copied between stores, retention's prune, the roles
    # and migrations; they know every component's tables
    ("agentmend.infrastructure.store.copying", 10),
    ("agentmend.infrastructure.store.retention", 10),
    ("agentmend.infrastructure.store.roles", 10),
    ("agentmend.roles", 20),
    ("agentmend.loop", 30),
    ("agentmend.faces", 40),
    ("agentmend.faces.workspace", 40),
    ("agentmend.faces.release_serving", 41),
    ("agentmend.faces.report", 42),
    ("agentmend.faces.mcp", 43),
    ("agentmend.faces.session", 43),
    ("agentmend.faces.pytest_plugin", 43),
    ("agentmend.faces.cli", 44),
)
# the package's own front doors: the lazy public surface and the ``python -m`` shims
FRONT_DOORS = 50

# one concept per folder: a folder past this many modules is split, or listed here with why
MAX_MODULES = 12
LARGE_FOLDERS: dict[str, str] = {}


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
    graph = import_graph(ROOT)
    # a rename that left every import unresolved would pass the checks below with no edges
    assert sum(len(targets) for targets in graph.values()) > 500
    assert upward_imports(graph) == []


def folder_sizes(root: Path) -> dict[str, int]:
    """Modules per package folder (``__init__`` and ``__main__`` do not count)."""
    sizes: dict[str, int] = {}
    for folder in PACKAGES:
        for directory in [root / folder, *(root / folder).rglob("*")]:
            if directory.is_dir() and (directory / "__init__.py").exists():
                modules = [
                    p for p in directory.glob("*.py") if p.stem not in ("__init__", "__main__")
                ]
                sizes[directory.relative_to(root).as_posix()] = len(modules)
    return sizes


def oversized_folders(root: Path) -> list[str]:
    return sorted(
        f"{folder} ({count} modules)"
        for folder, count in folder_sizes(root).items()
        if count > MAX_MODULES and folder not in LARGE_FOLDERS
    )


def prefixed_modules(root: Path) -> list[str]:
    """Modules named ``<package>_<x>.py`` inside ``<package>/``: a prefix standing in for a
    folder."""
    return sorted(
        path.relative_to(root).as_posix()
        for folder in PACKAGES
        for path in (root / folder).rglob("*.py")
        if path.stem.startswith(f"{path.parent.name}_")
    )


def test_no_folder_holds_more_than_a_dozen_modules() -> None:
    assert folder_sizes(ROOT)["infrastructure"] > 0  # the walk found the tree
    assert oversized_folders(ROOT) == []


def test_no_module_repeats_its_package_name_as_a_prefix() -> None:
    assert prefixed_modules(ROOT) == []


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
            "infrastructure/store/api.py",
            "\nif False:\n    from agentmend.roles.team import AgentTeam\n",
            "agentmend.infrastructure.store.api -> agentmend.roles.team",
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
        (  # inside infrastructure: the store beneath the changes
            "infrastructure/store/api.py",
            "\ndef _late() -> None:\n    from agentmend.infrastructure.changes import gates\n",
            "agentmend.infrastructure.store.api -> agentmend.infrastructure.changes.gates",
        ),
        (  # inside faces: the report beneath the command line
            "agents/faces/report/page.py",
            "\ndef _late() -> None:\n    from agentmend.faces.cli import common\n",
            "agentmend.faces.report.page -> agentmend.faces.cli.common",
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
            "    from agentmend.infrastructure.store.api import Store\n"
        )
    cycles = import_cycles(import_graph(root))
    assert any(
        {"agentmend.infrastructure.errors", "agentmend.infrastructure.store.api"} <= set(c)
        for c in cycles
    )


# The executions table has one writer (the monitor's ExecutionStore) and one reader for everyone
# else (monitoring/run_reader.py); the rollup modules' migrations build their tables from it once.
RUNS_TABLE_OWNERS: dict[str, str] = {
    "infrastructure/monitoring/execution_store.py": "the writer: inserts, deletes, its own state",
    "infrastructure/monitoring/run_reader.py": "the one reader",
    "infrastructure/monitoring/execution_rollup.py": "its migration fills the rollup from the runs",
    "infrastructure/monitoring/run_series.py": "its migration fills the series from the runs",
    "infrastructure/monitoring/run_fold.py": "adds the runs not rolled up yet to the rollups",
}
# SQL keywords are written in capitals throughout, so prose ("turned into executions") is not SQL
_RUNS_TABLE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+executions\b")


def runs_table_users(root: Path) -> list[str]:
    """Modules that name the executions table in SQL."""
    return sorted(
        path.relative_to(root).as_posix()
        for folder in PACKAGES
        for path in (root / folder).rglob("*.py")
        if _RUNS_TABLE.search(path.read_text(encoding="utf-8"))
    )


def test_only_the_run_reader_reads_the_executions_table() -> None:
    users = runs_table_users(ROOT)
    assert "infrastructure/monitoring/run_reader.py" not in users  # it names the table once
    assert "infrastructure/monitoring/execution_store.py" in users  # the search finds SQL
    assert [u for u in users if u not in RUNS_TABLE_OWNERS] == []


def test_an_injected_reader_of_the_executions_table_is_caught(tmp_path: Path) -> None:
    root = _copy_package(tmp_path)
    with (root / "agents/faces/report/data.py").open("a", encoding="utf-8") as handle:
        handle.write('\n_QUERY = "SELECT success FROM executions WHERE agent = ?"\n')
    assert "agents/faces/report/data.py" in runs_table_users(root)
