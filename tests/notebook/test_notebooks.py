"""Every notebook runs headless with CUCO_SMOKE=1 and leaves nothing running.

Each notebook is copied into a temporary folder (JupyterLab may serve a copy too, so the notebooks must find the
repository on their own) and executed by nbclient with the venv's python3 kernel. A final cell, appended here
and not part of the committed notebook, asserts inside the kernel that no non-daemon or cuco-* thread, no fake
LLM server and no child process is left (tests/unit/workbench/test_smoke.py shows that check is not vacuous). After the
kernel has shut down, this side scans /proc for any process still carrying the tag this test put in the
kernel's environment (children inherit it, even when orphaned).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["00_quickstart", "01_fast_path", "02_search", "03_multi_gpu_eval", "04_run_analysis", "05_teaching",
            "06_your_kernel"]
CELL_TIMEOUT_S = 180  # one cell; the whole notebook is bounded by pytest's --timeout in scripts/test.sh
TAG_ENV = "CUCO_NB_TEST_TAG"

FINAL_CHECK = """\
from cuco_kit.workbench import smoke as _smoke
_left = _smoke.leftovers(wait_s=10)
assert not _left, "the notebook left things running: " + "; ".join(_left)
print("CUCO-NOTEBOOK-CLEAN")
"""


def _tagged_processes(tag: str) -> list[int]:
    """Living processes whose environment carries TAG_ENV=tag (read from /proc; no psutil)."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(d.name))
    return found


def test_all_expected_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless_and_leaves_nothing(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    nb = nbformat.read(path, as_version=4)
    # Committed without outputs, and each says what it shows first and what to do next last.
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has outputs"
    assert nb.cells[0].cell_type == "markdown" and "shows" in nb.cells[0].source.lower()
    assert nb.cells[-1].cell_type == "markdown" and "next" in nb.cells[-1].source.lower()

    work = tmp_path / "nb"
    work.mkdir()
    shutil.copy(path, work / path.name)
    nb.cells.append(nbformat.v4.new_code_cell(FINAL_CHECK))
    tag = uuid.uuid4().hex
    monkeypatch.setenv("CUCO_SMOKE", "1")
    monkeypatch.delenv("CUCO_BROWSER_TEST", raising=False)
    monkeypatch.setenv(TAG_ENV, tag)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(work)}})
    t0 = time.monotonic()
    try:
        client.execute()
    finally:
        deadline = time.monotonic() + 10
        while _tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        stray = _tagged_processes(tag)
        for pid in stray:  # processes this test started: end them by id so later tests start clean
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    elapsed = time.monotonic() - t0
    final = nb.cells[-1]
    text = "".join(o.get("text", "") for o in final.outputs if o.get("output_type") == "stream")
    assert "CUCO-NOTEBOOK-CLEAN" in text, final.outputs
    assert not stray, f"{path.name}: processes left after the kernel shut down: {stray}"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    # A red box (stderr) reads as an alarm to a newcomer: an expected condition is said in a banner or a line.
    red = [o.get("text", "")[:300] for c in nb.cells if c.cell_type == "code" for o in c.outputs
           if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not red, f"{path.name}: stderr output: {red}"
    print(f"{path.name}: {elapsed:.1f} s")
