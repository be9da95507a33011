"""The watcher of a private MPS daemon: it ends the daemon when its owner is killed (SIGKILL, no clean-up), and
only that daemon; it leaves when the owner stopped the daemon itself. A copy of `sleep` named like the daemon
stands in for nvidia-cuda-mps-control (no GPU here)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cuco_kit.evaluate.mps import private_daemon_pids, start_reaper


def fake_daemon(tmp_path: Path, pipe: Path) -> subprocess.Popen[bytes]:
    exe = tmp_path / "bin" / "nvidia-cuda-mps-control"
    if not exe.exists():
        exe.parent.mkdir(exist_ok=True)
        sleep = shutil.which("sleep")
        assert sleep is not None
        shutil.copy(sleep, exe)
    return subprocess.Popen([str(exe), "300"], env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)})


@pytest.fixture()
def daemons(tmp_path: Path):
    started: list[subprocess.Popen[bytes]] = []
    yield lambda pipe: started.append(fake_daemon(tmp_path, pipe)) or started[-1]
    for p in started:
        p.kill()
        p.wait()


def test_the_daemon_of_a_killed_owner_is_ended_and_no_other(tmp_path: Path, daemons) -> None:
    mine, other = daemons(tmp_path / "pipe-mine"), daemons(tmp_path / "pipe-other")
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    assert private_daemon_pids(str(tmp_path / "pipe-mine")) == [mine.pid]
    reaper = start_reaper(sys.executable, owner.pid, str(tmp_path / "pipe-mine"))
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        assert reaper.wait(timeout=30) == 0
        assert mine.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None, "the watcher ended a daemon that was not its own"
    finally:
        reaper.kill()
        owner.kill()


def test_the_watcher_leaves_when_the_owner_stopped_the_daemon(tmp_path: Path, daemons) -> None:
    mine = daemons(tmp_path / "pipe")
    reaper = start_reaper(sys.executable, os.getpid(), str(tmp_path / "pipe"))
    try:
        mine.kill()
        mine.wait()
        assert reaper.wait(timeout=30) == 0
    finally:
        reaper.kill()
