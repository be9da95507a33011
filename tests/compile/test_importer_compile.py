"""Both test programs (cuco_kit/importer/examples/) go from `cuco init` to a workload folder whose seed compiles with
the REAL nvcc and whose reference (a labelled FIXTURE answer, approved) runs on the CPU: `cuco check-workload`
passes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cuco_kit.importer.session import ImportSession
from cuco_kit.llm import fixtures

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "cuco_kit" / "importer" / "examples"  # the two test programs, shipped for the notebook


def cuco(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuco_kit", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("program, reference", [("allreduce_norm.cu", "own_norm_reference.txt"),
                                                ("ring_attention.cu", "own_ring_reference.txt")])
def test_init_to_a_folder_that_checks(tmp_path, program, reference):
    d = tmp_path / "wl"
    made = cuco("init", EXAMPLES / program, "--workload", d)
    assert made.returncode == 0, made.stderr
    before = cuco("check-workload", d)
    assert before.returncode == 1 and "compiles for nccl" in before.stdout, before.stdout
    ImportSession(EXAMPLES / program, d).accept_reference(fixtures.load(reference))
    after = cuco("check-workload", d)
    assert after.returncode == 0, after.stdout
    assert "reference on 2 rank(s): runs on the CPU" in after.stdout
