"""The CUDA MPS daemon for the `symm` backend: ranks sharing one GPU run concurrently under MPS (time-sliced
without it, which makes a spinning rank wait for the others' time slices).

Rules:
  - use a daemon that already answers (the default pipe directory) and never stop it;
  - otherwise start ``nvidia-cuda-mps-control -d`` with a PRIVATE pipe/log directory, which only our rank
    processes see (the parent's own environment is untouched), and stop it (``echo quit | ...``) when done;
  - each rank gets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (default round(100 / world), at least 1: every rank can be
    resident at once, so a rank spinning on a peer's flag never starves the peer of SMs);
  - after a fatal fault: the caller reaps all ranks, then ``recover()`` opens a canary context in a child and
    restarts the daemon we started when the canary fails;
  - if MPS cannot be started, ranks run time-sliced and provenance says mps=false;
  - the daemon and the canary get the rank allow-list of the environment (launcher.inherited_env), not the
    parent's: a rank that can see their /proc must find no secret there;
  - one daemon per GPU set: an executor slot's evaluator starts its own (its own pipe directory) with the slot's
    CUDA_VISIBLE_DEVICES, so several slots on one host each have MPS on their own GPUs;
  - a daemon we start gets a watcher (mps_reaper.py) that ends it if this process dies without stopping it
    (SIGKILL of a Ray actor or a notebook kernel).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cuco_kit.evaluate.device import MULTICAST_OFF, REPO_ROOT
from cuco_kit.evaluate.launcher import inherited_env

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
CANARY = "import torch; x = torch.ones(1, device='cuda'); torch.cuda.synchronize(); print(float(x.sum()))"


def default_thread_percentage(world: int) -> int:
    return max(1, min(100, round(100 / max(1, world))))


def _control(cmd: str, env: dict[str, str], timeout_s: float = 10.0) -> tuple[int, str]:
    exe = shutil.which(CONTROL)
    if exe is None:
        return 127, f"{CONTROL} not found on PATH"
    try:
        p = subprocess.run([exe], input=cmd + "\n", capture_output=True, text=True, env=env, timeout=timeout_s)
        return p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        return 124, f"{CONTROL} did not answer {cmd!r} within {timeout_s:.0f} s"
    except OSError as exc:
        return 126, str(exc)


def _env_with(pipe_dir: str | None, log_dir: str | None, visible_devices: str | None = None) -> dict[str, str]:
    env = inherited_env()
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    if pipe_dir:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    if log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    return env


def daemon_answers(pipe_dir: str | None = None) -> bool:
    """True when an MPS control daemon answers on ``pipe_dir`` (default: the system pipe directory)."""
    if pipe_dir is None and not Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE_DIR)).exists():
        return False
    if pipe_dir is not None and not Path(pipe_dir, "control").exists():
        return False
    rc, _ = _control("get_server_list", _env_with(pipe_dir, None), timeout_s=5)
    return rc == 0


@dataclass
class MpsState:
    active: bool  # ranks run under MPS
    started_by_us: bool
    pipe_dir: str | None = None  # private directory when we started the daemon; None = default/system
    log_dir: str | None = None
    note: str = ""
    thread_percentage: dict[int, int] = field(default_factory=dict)

    def rank_env(self, rank: int, world: int, percentage: int | None = None) -> dict[str, str]:
        """Variables for one rank process (never set in the parent)."""
        if not self.active:
            return {}
        env: dict[str, str] = {}
        if self.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        pct = percentage if percentage is not None else default_thread_percentage(world)
        self.thread_percentage[rank] = pct
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        return env


class MpsDaemon:
    """Start (if needed), check, recover and stop the MPS daemon for our rank processes."""

    def __init__(self, root: str | Path | None = None, python: str = sys.executable,
                 canary_timeout_s: float = 90.0, visible_devices: str | None = None) -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="cuco-mps-"))
        self.visible_devices = visible_devices  # the GPU set the daemon serves (None: all)
        self.python = python
        self.canary_timeout_s = canary_timeout_s
        self.state = MpsState(False, False, note="not started")
        self._reaper: subprocess.Popen[bytes] | None = None

    def ensure(self) -> MpsState:
        if self.state.active:
            return self.state
        if daemon_answers(None):
            self.state = MpsState(True, False, note="using the MPS daemon that was already running")
            return self.state
        if shutil.which(CONTROL) is None:
            self.state = MpsState(False, False, note=f"{CONTROL} not found: ranks run time-sliced")
            return self.state
        pipe, log = self.root / "pipe", self.root / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        log.mkdir(parents=True, exist_ok=True)
        rc, out = _control_start(str(pipe), str(log), self.visible_devices)
        if rc != 0:
            self.state = MpsState(False, False, note=f"could not start MPS ({out}): ranks run time-sliced")
            return self.state
        self.state = MpsState(True, True, str(pipe), str(log), note="started a private MPS daemon")
        self._reaper = start_reaper(self.python, os.getpid(), str(pipe))
        ok, why = self.canary()
        if not ok:
            self.stop()
            self.state = MpsState(False, False, note=f"MPS started but a client could not run ({why}): "
                                  "ranks run time-sliced")
        return self.state

    def canary(self) -> tuple[bool, str]:
        """Open a CUDA context in a child under the current MPS settings; (ok, output)."""
        env = _env_with(None, None, self.visible_devices)
        env.update(self.state.rank_env(0, 1, 100) if self.state.active else {})
        env.update(MULTICAST_OFF)
        try:
            p = subprocess.run([self.python, "-c", CANARY], capture_output=True, text=True, env=env,
                               timeout=self.canary_timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, f"canary timed out after {self.canary_timeout_s:.0f} s"
        out = (p.stdout + p.stderr).strip()[-500:]
        return p.returncode == 0 and "1.0" in p.stdout, out

    def recover(self) -> str:
        """After a fatal fault (ranks already reaped): canary; restart our daemon if it fails. Returns a note."""
        if not self.state.active:
            return "no MPS"
        # The server needs a moment to tear down a killed client's context (error 807 meanwhile).
        for attempt in range(4):
            ok, out = self.canary()
            if ok:
                return "MPS canary ok after the fault" + (f" (after {attempt} retries)" if attempt else "")
            time.sleep(2.0)
        if not self.state.started_by_us:
            return f"MPS canary failed after the fault and the daemon is not ours to restart: {out}"
        self.stop()
        self.state = MpsState(False, False)
        st = self.ensure()
        return f"MPS canary failed after the fault ({out}); restarted the daemon: {st.note}"

    def stop(self) -> None:
        """Quit the daemon only if we started it; wait until it is gone."""
        st = self.state
        if not (st.active and st.started_by_us):
            return
        end_daemon(str(st.pipe_dir), st.log_dir)
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=10)  # it sees the daemon gone within a poll
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None
        self.state = MpsState(False, False, note="stopped the MPS daemon we started")

    def provenance(self) -> dict[str, object]:
        return {"mps": self.state.active, "mps_started_by_us": self.state.started_by_us, "mps_note": self.state.note,
                "mps_thread_percentage": dict(self.state.thread_percentage)}


def _control_start(pipe_dir: str, log_dir: str, visible_devices: str | None = None) -> tuple[int, str]:
    exe = shutil.which(CONTROL)
    assert exe is not None
    try:
        p = subprocess.run([exe, "-d"], capture_output=True, text=True,
                           env=_env_with(pipe_dir, log_dir, visible_devices),
                           timeout=30)
    except (subprocess.TimeoutExpired, OSError) as exc:
        return 1, str(exc)
    if p.returncode != 0:
        return p.returncode, (p.stdout + p.stderr).strip() or f"exit code {p.returncode}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if daemon_answers(pipe_dir):
            return 0, ""
        time.sleep(0.1)
    return 1, "the daemon did not answer within 10 s"


def start_reaper(python: str, owner: int, pipe_dir: str) -> subprocess.Popen[bytes]:
    """The watcher that ends the daemon on ``pipe_dir`` if ``owner`` dies first (mps_reaper.py); in a session
    of its own, so a signal to the owner's process group does not end it too."""
    env = inherited_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([python, "-m", "cuco_kit.evaluate.mps_reaper", str(owner), pipe_dir], env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def end_daemon(pipe_dir: str, log_dir: str | None = None) -> None:
    """Quit the daemon on ``pipe_dir`` and wait until it is gone. A server wedged by a hung client may ignore
    quit: then end the processes of THAT daemon (matched by its private pipe directory), never anyone else's."""
    _control("quit", _env_with(pipe_dir, log_dir))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and daemon_answers(pipe_dir):
        time.sleep(0.2)
    for pid in private_daemon_pids(pipe_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def private_daemon_pids(pipe_dir: str) -> list[int]:
    needle = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    out = []
    for pid in mps_daemon_pids():
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                out.append(pid)
        except OSError:
            continue
    return out


def parent_pid(pid: int) -> int | None:
    """A process's parent, from /proc; None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def mps_pids_since(before: set[int]) -> list[int]:
    """MPS processes that were not running when ``before`` (mps_daemon_pids()) was taken, except a server that a
    daemon from before started (for our clients or anyone's): that daemon is not ours to stop, nor its server."""
    return sorted(p for p in set(mps_daemon_pids()) - before if parent_pid(p) not in before)


def mps_daemon_pids() -> list[int]:
    """PIDs of running nvidia-cuda-mps-control/-server processes (for the leak check)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            # A daemon that exited but was not reaped by its (re-parented) parent is a zombie, not a leak.
            if comm.startswith("nvidia-cuda-mps") and state != "Z":
                out.append(int(d.name))
    return out
