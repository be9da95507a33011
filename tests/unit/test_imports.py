"""Import rules, enforced here so the layout stays honest:
- the engine (cuco_kit/) never imports the notebook layer, the tests or the benchmarks, and reads no test data;
- evaluation imports neither the LLM code nor the search;
- what runs on the GPU machine imports only what its image has (stdlib, numpy, torch, cupy) at module level;
- imports sit at the top of a module; inside a function only for a heavy package (HEAVY) or a kit module that
  imports one at its top, so a file's dependencies are visible where it starts;
- the notebook layer installs as cuco_kit.widgets only."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "cuco_kit"
WIDGETS = ROOT / "widgets"
# Third-party packages imported inside the functions that need them: slow to import, or absent from the GPU
# machine's image. The same list as ruff's banned-module-level-imports in pyproject.toml.
HEAVY = frozenset({"torch", "tree_sitter", "tree_sitter_cuda", "optuna", "scipy", "pandas", "plotly", "openai",
                   "IPython", "ipywidgets", "cupy", "nbformat", "nbclient", "playwright",
                   "ray"})
# Top-level modules the GPU machine image provides besides the standard library.
GPU_IMAGE = frozenset({"numpy", "torch", "cupy", "cuco_kit"})
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


def kit_modules() -> dict[str, Path]:
    """The engine's modules and the notebook layer's, under their installed names (widgets/ is cuco_kit.widgets)."""
    mods = engine_modules()
    for p in sorted(WIDGETS.rglob("*.py")):
        parts = ["cuco_kit", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = p
    return mods


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, module_level_only: bool, module: str | None = None) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file; with module_level_only, those that run when the
    module is imported: not inside functions or lambdas, not under `if TYPE_CHECKING:`. module: the file's
    dotted name (default: from its place in the repository)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    current = module or module_name(path)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if module_level_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if module_level_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(current, is_package, node)
            found.append((base, node.lineno))
            # `from cuco_kit import blocks` imports the module cuco_kit.blocks when there is one.
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            found.append((node.args[0].value, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_engine_never_imports_the_notebook_layer_tests_or_benchmarks():
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for path in engine_modules().values() for name, line in imports(path, module_level_only=False)
                 if name.split(".")[0] in ("ipywidgets", "widgets", "tests", "benchmarks", "common")
                 or name.startswith("cuco_kit.widgets")]
    assert not offenders, ("the engine (cuco_kit/) must not import the notebook layer, tests or benchmarks:\n"
                           + "\n".join(offenders))


def test_engine_reads_no_test_data():
    # Fixture answers the notebooks use are package data (cuco_kit/llm/fixtures/), not files under tests/.
    offenders = []
    for path in engine_modules().values():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.match(r"(\.\./)*tests(/|$)", node.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert not offenders, "the engine must not read tests/ at run time:\n" + "\n".join(offenders)


def test_evaluation_imports_neither_llm_nor_search():
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                 for mod, path in engine_modules().items() if mod.startswith("cuco_kit.evaluate")
                 for name, line in imports(path, module_level_only=False)
                 if name.startswith(("cuco_kit.llm", "cuco_kit.search", "cuco_kit.fastpath"))]
    assert not offenders, "evaluation must not depend on LLM or search code:\n" + "\n".join(offenders)


def heavy_modules(mods: dict[str, Path]) -> set[str]:
    """Kit modules that import a HEAVY package at module level, directly or through other kit modules."""
    top_imports = {m: [n for n, _ in imports(p, module_level_only=True, module=m)] for m, p in mods.items()}
    heavy = {m for m, names in top_imports.items() if any(n.split(".")[0] in HEAVY for n in names)}
    changed = True
    while changed:
        changed = False
        for m, names in top_imports.items():
            if m not in heavy and any(n in heavy for n in names):
                heavy.add(m)
                changed = True
    return heavy


def gpu_side_closure() -> dict[str, Path]:
    """cuco_kit.evaluate, cuco_kit.search, cuco_kit.store and every cuco_kit module they import at module level
    (their packages' __init__ files included: importing a submodule runs them)."""
    mods = engine_modules()
    todo = [m for m in mods if m.startswith(("cuco_kit.evaluate", "cuco_kit.search")) or m == "cuco_kit.store"]
    assert any(m.startswith("cuco_kit.evaluate") for m in todo) and any(m.startswith("cuco_kit.search") for m in todo)
    seen: dict[str, Path] = {}
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in mods:
            continue
        seen[mod] = mods[mod]
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(name for name, _ in imports(mods[mod], module_level_only=True) if name.startswith("cuco_kit"))
    return seen


def test_gpu_side_modules_import_only_what_the_gpu_image_has():
    closure = gpu_side_closure()
    assert "cuco_kit" in closure
    offenders = []
    for _, path in sorted(closure.items()):
        for name, line in imports(path, module_level_only=True):
            top = name.split(".")[0]
            if top not in STDLIB and top not in GPU_IMAGE:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name} at module level (reached from "
                                 "cuco_kit.evaluate/search/store; import it inside the function that needs it)")
    assert not offenders, "\n".join(offenders)


def function_imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(module, line) of the imports inside function bodies; `from pkg import a, b` gives pkg.a and pkg.b when
    those are kit modules, else pkg."""
    mods = kit_modules()
    out: list[tuple[str, int]] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                out.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", node)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                out.extend((n, node.lineno) for n in (subs or [base]))
    return sorted(set(out), key=lambda x: x[1])


def test_imports_inside_functions_are_only_for_heavy_packages():
    mods = kit_modules()
    heavy = heavy_modules(mods)
    gpu_side = set(gpu_side_closure())
    offenders = []
    for mod, path in sorted(mods.items()):
        for name, line in function_imports(path, mod):
            root = name.split(".")[0]
            if root in HEAVY or name in heavy:
                continue
            if mod in gpu_side and root not in STDLIB and root not in GPU_IMAGE:
                continue  # the GPU machine's image lacks it: it must stay inside the function
            offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name} inside a function (move it to the "
                             "top of the module)")
    assert not offenders, f"{len(offenders)} light imports inside functions:\n" + "\n".join(offenders)


def test_ruff_exempts_the_same_lazy_imports_as_this_file():
    """ruff's PLC0415 allows inside a function exactly what banned-module-level-imports lists. Its third-party
    names must be HEAVY, and its kit modules the heavy kit modules that some kit module imports inside a function:
    a light one listed would let ruff pass a lazy import that the test above rejects, a missing one would make
    ruff reject a lazy import that the GPU-side rule requires. Heavy kit modules that nothing imports lazily stay
    off the list: TID253 would only flag their legitimate top-level importers (per-file-ignores list those)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    banned = set(ruff["flake8-tidy-imports"]["banned-module-level-imports"])
    assert "TID253" in ruff["select"], "PLC0415 exempts banned-module-level-imports only while TID253 is selected"
    listed = {name for name in banned if name.split(".")[0] == "cuco_kit"}
    assert banned - listed == HEAVY
    mods = kit_modules()
    heavy = heavy_modules(mods)
    lazy = {name for mod, path in mods.items() for name, _ in function_imports(path, mod) if name in heavy}
    assert listed == lazy, (f"pyproject.toml banned-module-level-imports: add {sorted(lazy - listed)}, "
                            f"remove {sorted(listed - lazy)}")


def test_the_import_scanner_sees_module_level_and_lazy_imports(tmp_path):
    # The rules above are only as good as this scanner: check it on a file with every kind of import.
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom typing import TYPE_CHECKING\nimport optuna\nfrom . import archive\n"
                     "if TYPE_CHECKING:\n    import pandas\n"
                     "def f():\n    import openai\n    importlib.import_module('yaml')\n")
    top = {n for n, _ in imports(probe, module_level_only=True, module="cuco_kit.search.probe")}
    every = {n for n, _ in imports(probe, module_level_only=False, module="cuco_kit.search.probe")}
    assert {"os", "optuna", "cuco_kit.search", "cuco_kit.search.archive"} <= top
    assert not {"pandas", "openai", "yaml"} & top
    assert {"openai", "yaml", "pandas"} <= every


def test_no_top_level_widgets_module_is_importable(tmp_path):
    # Run from an unrelated folder so the repository root is not on sys.path: what is seen is the install.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.util as u, json\n"
            "w = u.find_spec('widgets')\n"
            "cw = u.find_spec('cuco_kit.widgets')\n"
            "print(json.dumps([w is None, cw.origin if cw else None]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    no_widgets, origin = __import__("json").loads(proc.stdout)
    assert no_widgets, "a top-level module named 'widgets' is importable from the installed package"
    if origin is None:
        pytest.fail("cuco_kit.widgets is not importable from the installed package (pip install -e .)")
    assert Path(origin).resolve() == (ROOT / "widgets" / "__init__.py").resolve()
