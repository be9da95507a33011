"""ruff and mypy, configured in pyproject.toml, hold over the whole repository: a finding fails the compile tier
(the static checks: mypy alone takes about 45 s on a fresh clone, most of the unit tier's budget margin)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: it comes with the dev extra (pip install -e '.[dev]')")
    return exe


def test_ruff_finds_nothing() -> None:
    p = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


@pytest.mark.timeout(240)
def test_mypy_finds_nothing(tmp_path: Path) -> None:
    # A fresh cache each run: CI starts clean, and a stale cache could hide a finding.
    p = subprocess.run([_tool("mypy"), "--cache-dir", str(tmp_path / "mypy-cache")], cwd=ROOT,
                       capture_output=True, text=True, timeout=230)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


def test_the_strict_gates_stay_on() -> None:
    """The settings the two runs above hold the code to: no dead noqa, every def annotated, no bare generics, and
    the samples' workload.py (what users copy) checked too."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "RUF100" in cfg["tool"]["ruff"]["lint"]["select"]
    mypy = cfg["tool"]["mypy"]
    assert all(mypy.get(k) is True for k in ("disallow_untyped_defs", "disallow_incomplete_defs",
                                              "disallow_any_generics", "check_untyped_defs"))
    assert "sample_kernels/*/workload.py" in mypy["files"]
