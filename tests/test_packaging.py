"""The distributions: names, the ``all`` extra, and which installed copy the suite runs.

.ci/run runs the whole suite twice: against the editable installs of
requirements-dev.txt, then against wheels installed in a clean venv
(``PRISM_TEST_WHEELS=1``), from outside the checkout.  The second run only
proves the wheels if the code under test really came from them, which the last
test here checks.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

import orjson

import prism_proxy
from prism_proxy.distribution import DISTRIBUTION

REPO = Path(__file__).resolve().parents[1]


def project(directory: Path) -> dict:
    data: dict = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
    return data


def requirement_name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert found, requirement
    return found.group(0).lower().replace("_", "-")


def bundled_plugins() -> dict[str, str]:
    """Each directory under plugins/ and the distribution it builds."""
    return {
        path.name: project(path)["name"]
        for path in sorted((REPO / "plugins").iterdir())
        if (path / "pyproject.toml").is_file()
    }


def test_the_core_and_every_plugin_depend_on_one_distribution_name():
    assert project(REPO)["name"] == DISTRIBUTION
    plugins = bundled_plugins()
    assert plugins
    for directory in plugins:
        dependencies = project(REPO / "plugins" / directory)["dependencies"]
        assert DISTRIBUTION in {requirement_name(d) for d in dependencies}, directory


def test_the_all_extra_and_the_dev_requirements_hold_every_bundled_plugin():
    plugins = bundled_plugins()
    extra = project(REPO)["optional-dependencies"]["all"]
    assert sorted(requirement_name(r) for r in extra) == sorted(plugins.values())
    editable = {
        line.split()[1].split("[")[0]
        for line in (REPO / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("-e ")
    }
    # Besides the plugins: the fake upstream and the incident lab (its tests run too).
    contrib = {"contrib/fake-upstream", "contrib/incident-lab"}
    assert editable == {"."} | contrib | {f"plugins/{d}" for d in plugins}


def installed_location(dist: importlib.metadata.Distribution) -> Path:
    """Where ``dist``'s code lives: its checkout when editable, else site-packages."""
    direct = dist.read_text("direct_url.json")
    if direct is not None:
        origin = orjson.loads(direct)
        if origin.get("dir_info", {}).get("editable"):
            url = urllib.parse.urlsplit(origin["url"])
            return Path(urllib.request.url2pathname(url.path)).resolve()
    return Path(str(dist.locate_file(""))).resolve()


def is_editable(dist: importlib.metadata.Distribution) -> bool:
    direct = dist.read_text("direct_url.json")
    return direct is not None and bool(orjson.loads(direct).get("dir_info", {}).get("editable"))


def test_the_code_under_test_is_the_installed_distributions():
    """Each package the suite imports is the copy its distribution installed.

    In the wheel run a package imported from the checkout instead (the source
    tree shadowing site-packages) would make that run prove nothing.
    """
    modules = [(importlib.metadata.distribution(DISTRIBUTION), prism_proxy.__file__)]
    for entry_point in importlib.metadata.entry_points(group="prism_proxy"):
        assert entry_point.dist is not None, entry_point
        module = importlib.import_module(entry_point.module)
        modules.append((entry_point.dist, module.__file__))
    assert len(modules) > len(bundled_plugins())
    wheel_run = os.environ.get("PRISM_TEST_WHEELS") == "1"
    for dist, file in modules:
        assert file is not None
        name = dist.metadata["Name"]
        assert Path(file).resolve().is_relative_to(installed_location(dist)), (name, file)
        if wheel_run:
            assert not is_editable(dist), name
            assert not Path(file).resolve().is_relative_to(REPO), (name, file)
