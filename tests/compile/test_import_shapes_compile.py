"""Every shape of host program (tests/data/own_programs/, written for these tests) goes through `cuco init` to a
workload folder whose seed compiles with the REAL nvcc for both backends (`symm` serves its host NCCL through
runtime/symm_nccl/nccl.h), and `cuco check-workload` names only the reference and the tolerance as left to do."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "data" / "own_programs"
SHAPES = sorted(p.name for p in PROGRAMS.glob("*.cu"))


def cuco(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuco_kit", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def left_to_do(check_output: str) -> list[str]:
    """The names of the findings `cuco check-workload` prints as todo or error."""
    return [ln.split()[1].rstrip(":") for ln in check_output.splitlines() if ln.startswith(("todo", "error"))]


@pytest.mark.parametrize("name", SHAPES)
def test_each_shape_imports_to_a_seed_that_compiles(tmp_path, name):
    d = tmp_path / "wl"
    made = cuco("init", PROGRAMS / name, "--workload", d)
    assert made.returncode == 0, made.stderr
    checked = cuco("check-workload", d)
    assert checked.returncode == 1, checked.stdout
    assert "compiles for nccl" in checked.stdout and "compiles for symm" in checked.stdout, checked.stdout
    assert left_to_do(checked.stdout) == ["reference", "tolerance"], checked.stdout
    assert "verification uses the seed's outputs (differential) until a reference is approved" in checked.stdout
