"""Prompt templates, one Markdown file each; load with cuco_kit.prompts.load(name).

Templates use ``string.Template`` placeholders (``$name`` / ``${name}``) rather than ``str.format``: prompts
quote CUDA, whose braces would otherwise all need doubling. ``render`` fills them and names a missing one.
"""
from __future__ import annotations

import string
from functools import cache
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput

_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The prompt names available (file stems)."""
    return sorted(p.stem for p in _DIR.glob("*.md"))


@cache
def load(name: str) -> str:
    """The raw text of prompt ``name`` (``cuco_kit/prompts/<name>.md``)."""
    path = _DIR / f"{name}.md"
    if not path.is_file():
        raise BadInput(f"no prompt {name!r} in {_DIR}; prompts: {', '.join(names())}")
    return path.read_text(encoding="utf-8")


def placeholders(name: str) -> set[str]:
    """The placeholder names prompt ``name`` uses."""
    out: set[str] = set()
    for m in string.Template.pattern.finditer(load(name)):
        key = m.group("named") or m.group("braced")
        if key:
            out.add(key)
    return out


def render(name: str, **values: Any) -> str:
    """Prompt ``name`` with its placeholders filled; a placeholder left without a value is an error that names
    it (a silently empty section would mislead the model)."""
    missing = placeholders(name) - set(values)
    if missing:
        raise BadInput(f"prompt {name!r} needs value(s) for {', '.join(sorted(missing))}")
    return string.Template(load(name)).substitute({k: str(v) for k, v in values.items()})
