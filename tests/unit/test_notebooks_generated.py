"""The committed notebooks are what scripts/make_notebooks.py generates: an edit made to an .ipynb by hand (lost
at the next generation) or a generator change without regenerated notebooks fails here."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_notebooks_match_the_generator() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_notebooks.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"notebooks out of step with scripts/make_notebooks.py:\n{p.stdout}{p.stderr}"
