"""Start N rank processes the torchrun way, without torchrun or MPI, and kill them all on demand.

Every rank is a ``subprocess.Popen`` child with ``start_new_session=True``: its own session and process group, so
``killpg`` per rank reaches the rank and anything it spawned (a process can't join a group of another session,
hence one group per rank rather than one for all). The parent hosts a TCP store (torch's
``TCPStore``; the parent never touches CUDA) that ranks use for the NCCL unique id, per-phase status and the
command channel of the warm workers.

Environment of a rank (``rank_env``):
  - torchrun-style RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT;
  - NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 always (multicast off);
  - secrets removed: see ``is_secret`` (candidates are untrusted code running in these processes).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from cuco_kit.evaluate.device import MULTICAST_OFF

# The secret rule: a variable is dropped when its upper-cased name
#   - is one of the exact names below, or
#   - starts with AWS_, AZURE_, GCP_, GOOGLE_APPLICATION_ or OPENAI_ / ANTHROPIC_, or
#   - ends with _TOKEN, _KEY, _SECRET, _APIKEY, _API_KEY, _CREDENTIALS or _SESSION, or
#   - contains PASSWORD, PASSWD, SECRET or TOKEN anywhere.
# Names the harness itself sets are never secrets (NCCL_* and CUDA_* stay).
_SECRET_EXACT = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "OPENAI_API_KEY",
                 "CUCO_API_KEY", "NETRC", "SSH_AUTH_SOCK", "GIT_ASKPASS", "PGPASSWORD"}
_SECRET_PREFIX = ("AWS_", "AZURE_", "GCP_", "GOOGLE_APPLICATION_", "OPENAI_", "ANTHROPIC_")
_SECRET_SUFFIX = ("_TOKEN", "_KEY", "_SECRET", "_APIKEY", "_API_KEY", "_CREDENTIALS", "_SESSION")
_SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN")
_NEVER_SECRET_PREFIX = ("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "CUCO_STORE", "CUCO_WORKER")


def is_secret(name: str) -> bool:
    """True when an environment variable must not reach a rank process (the rule in the module docstring)."""
    up = name.upper()
    if up.startswith(_NEVER_SECRET_PREFIX):
        return False
    return (up in _SECRET_EXACT or up.startswith(_SECRET_PREFIX) or up.endswith(_SECRET_SUFFIX)
            or bool(_SECRET_WORDS.search(up)))


def free_port() -> int:
    """A TCP port that was free a moment ago (the store binds it right after; a race loses one retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, master_port: int, *, base: Mapping[str, str] | None = None,
             extra: Mapping[str, str] | None = None, local_rank: int | None = None) -> dict[str, str]:
    """The environment of one rank: ``base`` (default os.environ) minus secrets, plus torchrun variables,
    multicast off, then ``extra`` (which may not switch multicast back on)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not is_secret(k)}
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank), "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    })
    for k, v in (extra or {}).items():
        if is_secret(k):
            raise ValueError(f"rank_env: refusing to pass {k} to a rank process (looks like a secret)")
        env[k] = str(v)
    env.update(MULTICAST_OFF)
    return env


def host_store(port: int | None = None, timeout_s: float = 300.0) -> tuple[Any, int]:
    """A TCPStore hosted by this (parent) process. Returns (store, port). Imports torch.distributed only."""
    from torch.distributed import TCPStore

    last: Exception | None = None
    for _ in range(5):
        p = port or free_port()
        try:
            store = TCPStore("127.0.0.1", p, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout_s))
            return store, p
        except RuntimeError as exc:  # DistNetworkError: port taken between free_port and bind, try another
            last = exc
            if port:
                break
    raise RuntimeError(f"could not host a TCP store on 127.0.0.1 ({last}); is the loopback interface up?")


def client_store(port: int, timeout_s: float = 300.0, host: str = "127.0.0.1") -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def _tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return ("...\n" if size > limit else "") + text


@dataclass
class RankGroup:
    """N running rank processes in one process group, with stdout+stderr of each in ``log_dir/rank<r>.log``."""

    procs: list[subprocess.Popen]
    log_dir: Path
    pgids: list[int]
    cwd: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def world(self) -> int:
        return len(self.procs)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def dead(self) -> list[int]:
        """Ranks whose process has exited."""
        return [r for r, p in enumerate(self.procs) if p.poll() is not None]

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def wait(self, timeout_s: float) -> bool:
        """Wait for every rank to exit; False when the time ran out (the group is left running)."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill(self, grace_s: float = 3.0) -> None:
        """SIGTERM to every rank's process group, SIGKILL after ``grace_s``; reaps every rank. Idempotent."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for g in self.pgids:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            if sig == signal.SIGTERM and self.wait(grace_s) and not any(_group_alive(g) for g in self.pgids):
                break
        for p in self.procs:  # a rank that left the group still gets its own signal
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # grandchildren in the group are gone after SIGKILL; wait a moment so callers can check
        deadline = time.monotonic() + 2.0
        while any(_group_alive(g) for g in self.pgids) and time.monotonic() < deadline:
            time.sleep(0.02)

    def tails(self, limit: int = 4000) -> dict[str, str]:
        return {f"rank{r}": _tail(self.log_dir / f"rank{r}.log", limit) for r in range(self.world)}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def launch(argv: Sequence[str], world: int, *, scratch: Path, master_port: int,
           extra_env: Mapping[str, str] | None = None, per_rank_env: Sequence[Mapping[str, str]] | None = None,
           base_env: Mapping[str, str] | None = None, local_ranks: Sequence[int] | None = None) -> RankGroup:
    """Start ``argv`` as ``world`` rank processes. ``scratch/run`` is their cwd (nothing else is writable by
    design: not the store, not the build cache); logs go to ``scratch/logs``. Each rank starts its own session,
    so ``RankGroup.kill`` ends all of them and their children."""
    if world < 1:
        raise ValueError(f"launch: world size must be >= 1, got {world}")
    run_dir = Path(scratch) / "run"
    log_dir = Path(scratch) / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        for r in range(world):
            extra = dict(extra_env or {})
            if per_rank_env:
                extra.update(per_rank_env[r])
            env = rank_env(r, world, master_port, base=base_env, extra=extra,
                           local_rank=None if local_ranks is None else local_ranks[r])
            log = open(log_dir / f"rank{r}.log", "wb")
            try:
                p = subprocess.Popen(list(argv), cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
            finally:
                log.close()
            procs.append(p)
    except BaseException:
        if procs:
            RankGroup(procs, log_dir, [p.pid for p in procs], run_dir).kill(grace_s=0.5)
        raise
    return RankGroup(procs, log_dir, [p.pid for p in procs], run_dir)
