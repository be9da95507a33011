"""pyproject.toml is the one dependency source; environment.yml only installs it; packages map as designed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENV = yaml.safe_load((ROOT / "environment.yml").read_text())

# The dependency lists the project promises.
CORE = ["jupyterlab", "ipywidgets", "plotly", "anywidget", "pandas", "openai", "tree-sitter", "tree-sitter-cuda",
        "pygments", "tqdm"]
GPU = ["torch", "nvidia-nccl-cu13"]
DEV = ["pytest", "pytest-timeout", "nvidia-nccl-cu13", "nvidia-cublas", "torch"]


def requirements(specs: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, specs)}


def test_pyproject_lists_the_core_dependencies():
    core = requirements(PYPROJECT["project"]["dependencies"])
    missing = [name for name in CORE if canonicalize_name(name) not in core]
    assert not missing, f"pyproject [project.dependencies] lacks {missing}"
    assert core["ipywidgets"].specifier.contains("8.1.9") and not core["ipywidgets"].specifier.contains("8.1.8")


def test_pyproject_extras():
    extras = PYPROJECT["project"]["optional-dependencies"]
    gpu, dev = requirements(extras["gpu"]), requirements(extras["dev"])
    assert not [n for n in GPU if canonicalize_name(n) not in gpu]
    assert not [n for n in DEV if canonicalize_name(n) not in dev]
    # Compile checks need the NCCL headers of exactly the version the GPU machines run.
    assert str(dev["nvidia-nccl-cu13"].specifier) == "==2.28.9"
    # A bare `torch` in dev would pull a multi-GB CUDA build onto CPU machines: it must be pinned.
    assert any(s.operator == "==" for s in dev["torch"].specifier)


def test_cli_entry_point():
    assert PYPROJECT["project"]["scripts"]["cuco"] == "cuco_kit.cli:main"


def _pip_entries() -> tuple[list[str], list[str]]:
    conda, pip = [], []
    for dep in ENV["dependencies"]:
        if isinstance(dep, dict):
            pip.extend(dep.get("pip", []))
        else:
            conda.append(str(dep))
    return conda, pip


def test_environment_yml_installs_the_project_with_dev_extras():
    _, pip = _pip_entries()
    editable = [p for p in pip if re.fullmatch(r"-e\s+\.(\[[\w,\s-]+\])?", p.strip())]
    assert editable, f"environment.yml must install the project with pip ('-e .[dev]'); pip entries: {pip}"
    extras = set(re.findall(r"[\w-]+", editable[0].split("[", 1)[1])) if "[" in editable[0] else set()
    assert "dev" in extras
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"]), f"unknown extras {extras}"


def test_environment_yml_names_nothing_pyproject_lacks():
    conda, pip = _pip_entries()
    # conda provides only the interpreter and pip; every Python package comes from pyproject through pip.
    conda_names = {re.split(r"[<>=!\s]", c, maxsplit=1)[0] for c in conda}
    assert conda_names <= {"python", "pip"}, f"environment.yml installs {conda_names - {'python', 'pip'}} with " \
                                             "conda; put Python packages in pyproject.toml"
    declared = set(requirements(PYPROJECT["project"]["dependencies"]))
    for specs in PYPROJECT["project"]["optional-dependencies"].values():
        declared |= set(requirements(specs))
    others = [p for p in pip if not p.strip().startswith("-e")]
    lacking = [p for p in others if canonicalize_name(Requirement(p).name) not in declared]
    assert not lacking, f"environment.yml names {lacking}, which pyproject.toml lacks"


def test_environment_yml_python_satisfies_requires_python():
    conda, _ = _pip_entries()
    py = next((c for c in conda if c.startswith("python")), None)
    assert py is not None, "environment.yml pins no python"
    version = re.search(r"(\d+\.\d+)", py)
    assert version and Requirement(f"x{PYPROJECT['project']['requires-python']}").specifier.contains(
        version.group(1) + ".0")


def test_widgets_folder_installs_as_cuco_kit_widgets():
    st = PYPROJECT["tool"]["setuptools"]
    assert st["package-dir"]["cuco_kit.widgets"] == "widgets"
    assert "cuco_kit.widgets" in st["packages"]
    assert not [p for p in st["packages"] if p == "widgets" or p.startswith("widgets.")]


def _package_dir(package: str) -> Path:
    mapping = PYPROJECT["tool"]["setuptools"].get("package-dir", {})
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in mapping:
            return ROOT / mapping[prefix] / Path(*parts[i:])
    return ROOT / Path(*parts)


def test_every_package_folder_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for top, folder in (("cuco_kit", ROOT / "cuco_kit"), ("cuco_kit.widgets", ROOT / "widgets")):
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((top, *rel)))
    assert not found - listed, f"packages missing from [tool.setuptools] packages: {sorted(found - listed)}"
    for package in listed:
        assert (_package_dir(package) / "__init__.py").is_file(), f"{package} has no __init__.py"


@pytest.mark.parametrize("package", ["cuco_kit.runtime", "cuco_kit.prompts"])
def test_data_files_ship_with_their_package(package):
    # Files a wheel install needs at run time (headers, runtime sources, prompt templates) must match package-data.
    patterns = PYPROJECT["tool"]["setuptools"].get("package-data", {}).get(package, [])
    folder = _package_dir(package)
    # subfolders too (runtime/symm_nccl/), matched as setuptools globs them: "*.h" does not reach into a subfolder
    data = [p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert data, f"{package} holds no data files"
    shipped = {p for pat in patterns for p in folder.glob(pat)}
    unshipped = [p.relative_to(folder).as_posix() for p in data if p not in shipped]
    assert not unshipped, f"{package}: {unshipped} would be left out of a wheel (package-data: {patterns})"
