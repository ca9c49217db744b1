"""Lists the packages installed under ``agentmend`` (pyproject.toml holds everything else).

The repository keeps its two folders, ``agents/`` and ``infrastructure/``; pyproject.toml maps
them to ``agentmend`` and ``agentmend.infrastructure``. ``packages.find`` cannot rename what it
finds, so the subpackages are found here and named under their installed name.
"""

from setuptools import find_namespace_packages, setup


def _under(name: str, folder: str) -> list[str]:
    # namespace packages too: the data folders (role definitions, the simulated team) ship as
    # part of the tree they sit in
    found = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
    return [name, *(f"{name}.{package}" for package in found)]


setup(packages=_under("agentmend", "agents") + _under("agentmend.infrastructure", "infrastructure"))
