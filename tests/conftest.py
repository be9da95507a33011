"""Tiers are folders: every test under tests/<tier>/ carries the pytest marker <tier>."""
from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "compile", "notebook", "browser", "gpu")
ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests")
        tier = rel.parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
