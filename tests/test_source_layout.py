"""The shape of the source: plugins stand on the core alone, and no module grows past reading.

A plugin that imports another plugin's package cannot be installed, disabled
or replaced on its own; what two plugins share belongs on the core's public
surface (``prism_proxy``).  A module over 600 lines holds more than one
responsibility.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 600


def plugin_packages(repo: Path) -> dict[str, Path]:
    """Each bundled plugin's import package, by name (``prism_breaker``: its directory)."""
    return {
        package.name: package
        for plugin in sorted((repo / "plugins").iterdir())
        for package in plugin.glob("prism_*")
        if package.is_dir() and (package / "__init__.py").exists()
    }


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def cross_imports(repo: Path) -> list[str]:
    packages = plugin_packages(repo)
    found = []
    for name, package in packages.items():
        for path in sorted(package.rglob("*.py")):
            for other in sorted(imported_roots(path) & packages.keys() - {name}):
                found.append(f"{path.relative_to(repo)} imports {other}")
    return found


def long_modules(repo: Path) -> list[str]:
    sources = [repo / "prism_proxy", *plugin_packages(repo).values()]
    return [
        f"{path.relative_to(repo)}: {lines} lines"
        for source in sources
        for path in sorted(source.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]


def test_no_plugin_imports_another_plugins_package() -> None:
    assert len(plugin_packages(REPO)) >= 10  # the walk found the bundled plugins
    assert cross_imports(REPO) == []


def test_no_module_of_the_gateway_or_its_plugins_is_over_600_lines() -> None:
    assert long_modules(REPO) == []
