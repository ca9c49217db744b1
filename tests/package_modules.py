"""Every module of the package, imported by walking ``agentmend`` and ``agentmend.infrastructure``.

Tests that must cover every error or every record find them here, so a class added in a new
module is covered without anyone remembering to list it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import agentmend
import agentmend.infrastructure

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]


def modules_under_folder_names(root: Path = ROOT) -> list[str]:
    """Modules of this checkout imported as ``agents.*`` or ``infrastructure.*`` (the folders'
    own names, importable from the checkout) rather than as ``agentmend.*``."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] in ("agents", "infrastructure")
        and Path(getattr(module, "__file__", None) or "/").resolve().is_relative_to(root)
    )


def import_all_modules() -> list[ModuleType]:
    """Every module of both packages (``__main__`` shims excluded: importing one runs it)."""
    modules: list[ModuleType] = []
    # ``agentmend.infrastructure`` lives in its own folder, so walking ``agentmend`` misses it
    for package in (agentmend, agentmend.infrastructure):
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
            if info.name.rpartition(".")[2] == "__main__":
                continue
            modules.append(importlib.import_module(info.name))
    return modules


def all_subclasses(root: type[T]) -> list[type[T]]:
    """Every class below ``root`` defined in the package, after every module is imported."""
    import_all_modules()
    found: list[type[T]] = []
    pending = list(root.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.partition(".")[0] == "agentmend" and cls not in found:
            found.append(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))
