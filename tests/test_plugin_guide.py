"""The plugin author's guide documents every hook, and its examples are real code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from prism_proxy import hookspecs

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugin-guide.md"


def hook_names() -> list[str]:
    return [
        name
        for name, value in vars(hookspecs).items()
        if name.startswith("prism_") and inspect.isfunction(value)
    ]


def test_there_are_hooks():
    assert {"prism_classify", "prism_select_route", "prism_settle"} <= set(hook_names())


def test_every_hook_has_a_section_with_its_signature():
    text = GUIDE.read_text()
    missing = []
    for name in hook_names():
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        if f"### {name}\n" not in text or f"`{name}({params})`" not in text:
            missing.append(name)
    assert not missing, f"hooks missing from docs/plugin-guide.md (heading + signature): {missing}"


def test_every_hookspec_has_a_docstring():
    for name in hook_names():
        assert (getattr(hookspecs, name).__doc__ or "").strip(), name


def test_guide_examples_compile():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= len(hook_names())
    for index, block in enumerate(blocks):
        compile(block, f"plugin-guide.md example {index}", "exec")
