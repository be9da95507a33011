"""What the benchmark scripts print while they run: log lines on stdout and progress bars on stderr.

The bars are drawn only when stderr is a terminal (tqdm's ``disable=None``), so the logs the remote-GPU scripts
keep stay free of them; the log lines are flushed at once, so a run stopped at its time limit keeps every one.
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def say(line: str) -> None:
    """One line of the run's log, clear of any progress bar."""
    tqdm.write(line)
    sys.stdout.flush()


def progress(items: Iterable[Any] | None = None, desc: str = "", total: int | None = None,
             unit: str = "eval") -> tqdm:
    """``items`` (or a bar to ``update`` by hand, when None) with a progress bar on stderr."""
    return tqdm(items, desc=desc, total=total, unit=unit, disable=None, leave=False)
