"""scripts/workbench.sh starts offline once set up (no pip when .venv is up to date) and serves a given folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _repo_copy(tmp_path: Path) -> Path:
    """A repository with workbench.sh, an up-to-date stamp and a .venv whose `jupyter` prints its arguments; no
    setup-env.sh, so any attempt to install fails the run."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "workbench.sh", repo / "scripts" / "workbench.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (repo / ".venv" / "bin").mkdir(parents=True)
    fake = repo / ".venv" / "bin" / "jupyter"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    old = time.time() - 60
    os.utime(repo / "pyproject.toml", (old, old))
    (repo / ".venv" / ".cuco-installed").touch()
    return repo


def test_workbench_starts_without_pip_and_serves_a_folder(tmp_path: Path):
    repo = _repo_copy(tmp_path)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "00_quickstart.ipynb").write_text("{}")
    out = subprocess.run(["bash", str(repo / "scripts" / "workbench.sh"), str(folder), "--no-browser"],
                         capture_output=True, text=True, timeout=30, env={**os.environ, "PIP_NO_INDEX": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    args = out.stdout.split("\n")
    assert args[0] == "lab" and f"--ServerApp.root_dir={folder}" in args and "--ip=127.0.0.1" in args
    assert "--no-browser" in args and "--LabApp.default_url=/lab/tree/00_quickstart.ipynb" in args
    assert args.count(f"--ServerApp.root_dir={folder}") == 1 and not out.stderr
    default = subprocess.run(["bash", str(repo / "scripts" / "workbench.sh")], capture_output=True, text=True,
                             timeout=30)
    assert f"--ServerApp.root_dir={repo / 'notebooks'}" in default.stdout.split("\n")


def test_workbench_installs_when_the_stamp_is_stale_and_refuses_a_missing_folder(tmp_path: Path):
    repo = _repo_copy(tmp_path)
    bad = subprocess.run(["bash", str(repo / "scripts" / "workbench.sh"), str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "is not a folder" in bad.stderr
    (repo / "pyproject.toml").touch()  # newer than the stamp: set-up runs (and fails here: no setup-env.sh)
    stale = subprocess.run(["bash", str(repo / "scripts" / "workbench.sh"), "--version"],
                           capture_output=True, text=True, timeout=30)
    assert stale.returncode != 0 and "setup-env.sh" in stale.stderr
