"""Adding a workload needs no edit elsewhere: a sample folder copied under a new name is in the gpu tier's sample
tests, the race amplification's honest set and the stress-build test, and its seeds and baseline are found by
their file names. Each list is computed by the same function the tier uses, pointed at a copy of the repository's
samples plus the new folder."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from cuco_kit.workload import BASELINE_FILE, SEED_FILES, load_workload, sample_workloads

ROOT = Path(__file__).resolve().parents[3]
NEW = "my_new_workload"


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"under_test_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository root whose sample_kernels/ holds the samples and a copy of allgather named NEW."""
    root = tmp_path_factory.mktemp("repo")
    ignore = shutil.ignore_patterns("__pycache__")
    for d in sample_workloads(ROOT):
        shutil.copytree(d, root / "sample_kernels" / d.name, ignore=ignore)
    shutil.copytree(ROOT / "sample_kernels" / "allgather", root / "sample_kernels" / NEW, ignore=ignore)
    return root


def test_the_samples_are_the_folders(repo: Path) -> None:
    assert [d.name for d in sample_workloads(ROOT)] == sorted(p.parent.name for p in
                                                               (ROOT / "sample_kernels").glob("*/workload.py"))
    assert NEW in [d.name for d in sample_workloads(repo)]


def test_seeds_and_baseline_come_from_the_file_names(repo: Path) -> None:
    wl = load_workload(repo / "sample_kernels" / NEW)
    assert wl.seeds == SEED_FILES and wl.baseline == BASELINE_FILE
    assert wl.seed_for("symm") == repo / "sample_kernels" / NEW / "seed_copy.cu"
    for d in sample_workloads(ROOT):  # every sample is in the convention, and its gpu-tier presets exist
        wl = load_workload(d)
        assert wl.seeds == SEED_FILES and wl.baseline == BASELINE_FILE, d.name
        assert wl.check_presets and set(wl.check_presets) <= set(wl.size_presets), d.name


def test_a_folder_without_the_files_has_no_seeds(tmp_path: Path) -> None:
    d = tmp_path / "bare"
    shutil.copytree(ROOT / "sample_kernels" / "allgather", d, ignore=shutil.ignore_patterns("*.cu", "__pycache__"))
    wl = load_workload(d)
    assert wl.seeds == {} and wl.baseline is None


def test_the_gpu_tier_checks_the_new_sample(repo: Path) -> None:
    gpu = _module(ROOT / "tests" / "gpu" / "test_samples_gpu.py")
    cases = {tuple(c.values): c.marks for c in gpu.cases(repo)}
    assert (NEW, "small") in cases and not cases[(NEW, "small")]  # its first preset: in the quick form too
    assert {v for v in cases} - {(NEW, "small")} == {tuple(c.values) for c in gpu.cases(ROOT)}
    assert gpu.sources(repo / "sample_kernels" / NEW)["symm"] == ["seed_copy.cu", "device_lsa.cu"]


def test_the_race_amplification_runs_the_new_sample_honestly(repo: Path) -> None:
    script = _module(ROOT / "benchmarks" / "harness" / "race_amplification.py")
    honest = script.honest_set(repo)
    assert {(NEW, "device_lsa.cu"), (NEW, "seed_copy.cu")} <= set(honest)
    assert set(honest) - {(NEW, "device_lsa.cu"), (NEW, "seed_copy.cu")} == set(script.honest_set())


def test_the_stress_build_covers_the_new_sample(repo: Path) -> None:
    stress = _module(ROOT / "tests" / "compile" / "test_stress_build.py")
    new = {(p.name, b) for p, b in stress.cases(repo) if p.parent.name == NEW}
    assert ("device_lsa.cu", "symm") in new and ("seed_nccl.cu", "symm") in new
    assert new == {(p.name, b) for p, b in stress.cases(ROOT) if p.parent.name == "allgather"}
