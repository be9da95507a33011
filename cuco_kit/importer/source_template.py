"""The importer's source templates (``templates/*.in``), rendered with ``string.Template`` as the prompts are.

``$name`` / ``${name}`` placeholders rather than ``str.format``: the templates are CUDA, whose braces would
otherwise all need doubling. A placeholder alone on its line whose value is empty takes its line with it, so an
optional section leaves no blank line behind. A placeholder without a value is an error that names it.
"""
from __future__ import annotations

import string
from functools import cache
from pathlib import Path

from cuco_kit.errors import BadInput

_DIR = Path(__file__).resolve().parent / "templates"


@cache
def load(name: str) -> str:
    """The raw text of template ``name`` (``cuco_kit/importer/templates/<name>.in``)."""
    path = _DIR / f"{name}.in"
    if not path.is_file():
        raise BadInput(f"no source template {name!r} in {_DIR}; templates: "
                       f"{', '.join(sorted(p.stem for p in _DIR.glob('*.in')))}")
    return path.read_text(encoding="utf-8")


def placeholders(name: str) -> set[str]:
    """The placeholder names template ``name`` uses."""
    return {m.group("named") or m.group("braced") for m in string.Template.pattern.finditer(load(name))
            if m.group("named") or m.group("braced")}


def render(name: str, /, **values: str) -> str:
    """Template ``name`` with its placeholders filled (positional-only: a template may use ``name`` itself)."""
    missing = placeholders(name) - set(values)
    if missing:
        raise BadInput(f"source template {name!r} needs value(s) for {', '.join(sorted(missing))}")
    lines = [ln for ln in load(name).split("\n")
             if not any(ln.strip() in (f"${k}", f"${{{k}}}") for k, v in values.items() if v == "")]
    return string.Template("\n".join(lines)).substitute(values)
