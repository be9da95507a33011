"""Start N rank processes the torchrun way, without torchrun or MPI, and kill them all on demand.

Every rank is a ``subprocess.Popen`` child with ``start_new_session=True``: its own session and process group, so
``killpg`` per rank reaches the rank and anything it spawned (a process can't join a group of another session,
hence one group per rank rather than one for all). The parent hosts a TCP store (torch's ``TCPStore``; the
parent never touches CUDA) that ranks use for the NCCL unique id, per-phase status and the command channel of
the warm workers. The store listens on 127.0.0.1 only (a socket bound here, handed to torch), and every value in
it is sealed with a per-world token (seal.py, sealed_store.py): a local process that connects without the token
can list key names, but can neither read values nor write one that the parent or a rank accepts.

Candidates are untrusted code running in the rank processes. What keeps secrets out of their reach:

1. The environment is an ALLOW-list (``rank_env``), never the parent's environment minus a deny-list. Inherited
   are only ALLOWED_NAMES and names starting with ALLOWED_PREFIXES (paths, locale, CUDA/MPS, NCCL, torch,
   NVSHMEM and OpenMP tuning), and of those none whose name looks like a secret (``is_secret``: TORCH_HUB_TOKEN
   is dropped although TORCH_ is allowed). The launcher adds the torchrun variables (RANK, WORLD_SIZE,
   LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT) and TMPDIR (the world's
   scratch); then the caller's ``extra``, where a secret-looking name is refused except the kit's own
   CUCO_STORE_* / CUCO_WORKER_* (the store token is meant for the ranks); last, always, multicast off
   (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) and GLOO_SOCKET_IFNAME=lo
   (gloo's sockets on loopback, not on the host's outside address).
2. The parent makes itself non-dumpable (prctl PR_SET_DUMPABLE 0) before it starts a rank: a rank of the same
   uid that is not root can then read neither its /proc/<pid>/environ nor its memory (ptrace, /proc/<pid>/mem,
   process_vm_readv). It stays so for the life of the process, since a rank's child that left its group could
   outlive the world. What that costs: py-spy, gdb or lsof on that process need root; it writes no core dump.
   Children are not affected (execve makes a process dumpable again): ranks, nvcc, the MPS daemon.
3. When the parent is root, each world runs in its own PID namespace with a private /proc: a holder process
   (util-linux ``unshare --pid --fork --mount-proc``) owns the namespace, each rank enters it with ``nsenter``
   and runs under ``setpriv --bounding-set=-sys_admin``, so it cannot unmount that /proc (nor mount another,
   nor setns out). A rank then sees no process outside its world: not the parent, not the notebook server or
   shell above it, not the MPS daemon, not other jobs. Chosen over the other two ways to hide /proc because it
   changes nothing else a rank needs: a dedicated unprivileged uid could not read the build cache under root's
   home (mode 0700) and would make the MPS daemon switch servers between uids; a launcher started before the
   secrets are read does not exist in a notebook, whose kernel gets OPENAI_API_KEY in its environment at exec.
   In the namespace the ranks keep their files (build cache, torch, repository, scratch), one uid and one PID
   namespace per world (pidfd_getfd and CUDA IPC between ranks agree on pids), the MPS daemon (it is reached
   through its pipe directory) and their process groups. The namespace ends with the holder, which exits when
   the world is killed or the parent dies (it watches a pipe), taking every process left in it.
   Not available (not root, the tools missing, a container without CAP_SYS_ADMIN): the world runs in the
   parent's PID namespace and ``RankGroup.isolation`` says so and why (the evaluation's provenance carries it);
   a world that fails to start in a namespace is started again without one (pool.WorkerPool), never failed.
   Then, as root, a rank can read every process's /proc; not as root, every process of the same user except
   the parent (2.).

Not prevented, anywhere: root ranks read every file root can; any rank reaches the network; a rank holds the
store token (it must, to talk to the parent), so a candidate can speak the protocol of its own world.
"""
from __future__ import annotations

import ctypes
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from cuco_kit.evaluate.device import MULTICAST_OFF
from cuco_kit.evaluate.seal import new_token
from cuco_kit.evaluate.sealed_store import sealed_store

# What a rank inherits from the parent's environment: these names, and names with these prefixes, unless the
# name looks like a secret. Everything else a rank needs, the launcher or the caller sets.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR",
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "VIRTUAL_ENV",
    "CONDA_PREFIX", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "NVSHMEM_", "CUBLAS_", "CUBLASLT_")
# The kit's own channel variables: passed to ranks as given (the store token is meant for them).
OWN_PREFIXES = ("CUCO_STORE_", "CUCO_WORKER_")

# The secret rule (names, upper-cased): one of the exact names; a prefix of a cloud or LLM vendor; a suffix that
# names a key, password, token, credential or a URL/DSN/proxy (which may carry user:password@); or a word.
_SECRET_EXACT = {"NETRC", "SSH_AUTH_SOCK", "GIT_ASKPASS", "SSH_ASKPASS", "PGPASSWORD", "MYSQL_PWD", "APIKEY"}
_SECRET_PREFIX = ("AWS_", "AZURE_", "GCP_", "GOOGLE_APPLICATION_", "OPENAI_", "ANTHROPIC_")
_SECRET_SUFFIX = ("_KEY", "_PWD", "_PAT", "_SESSION", "_URL", "_URI", "_DSN", "_PROXY")
_SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|APIKEY|API_KEY|CREDENTIAL|AUTH|PRIVATE|WEBHOOK")

NS_TOOLS = ("unshare", "nsenter", "setpriv")
PR_SET_DUMPABLE = 4
# Unix socket paths (torch's symmetric memory binds $TMPDIR/symm_mem-<pid>) must fit in sockaddr_un's 108 bytes.
_MAX_TMPDIR = 80
# pid 1 of a world's PID namespace: reaps orphans as they die (so a dead rank is not left a zombie in its process
# group), says it is up, and exits when the parent's end of a pipe closes (the kernel then kills the rest).
_HOLDER = """import os, signal, sys
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
life, ready = int(sys.argv[1]), int(sys.argv[2])
os.write(ready, b"1")
os.close(ready)
while os.read(life, 64):
    pass
"""


def is_secret(name: str) -> bool:
    """True when an environment variable's name looks like it holds a secret (the rule above)."""
    up = name.upper()
    return (up in _SECRET_EXACT or up.startswith(_SECRET_PREFIX) or up.endswith(_SECRET_SUFFIX)
            or bool(_SECRET_WORDS.search(up)))


def inherited_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a process the kit starts may inherit from ``base`` (default os.environ): the allow-list, minus
    secret-looking names."""
    return {k: v for k, v in (os.environ if base is None else base).items()
            if (k in ALLOWED_NAMES or k.startswith(ALLOWED_PREFIXES)) and not is_secret(k)}


def rank_env(rank: int, world: int, master_port: int, *, base: Mapping[str, str] | None = None,
             extra: Mapping[str, str] | None = None, local_rank: int | None = None) -> dict[str, str]:
    """The environment of one rank (the module docstring, 1.): the allow-listed part of ``base`` (default
    os.environ), torchrun variables, then ``extra``, then multicast off and loopback gloo (which ``extra`` may
    not change)."""
    env = inherited_env(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank), "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "PYTHONUNBUFFERED": "1",
    })
    for k, v in (extra or {}).items():
        if is_secret(k) and not k.startswith(OWN_PREFIXES):
            raise ValueError(f"rank_env: refusing to pass {k} to a rank process (looks like a secret)")
        env[k] = str(v)
    env.update(MULTICAST_OFF)
    env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo listens where this names; the world is on one host
    return env


@dataclass
class HostedStore:
    """The parent's side of the control store: ``store`` seals and opens values (sealed_store),
    ``env()`` is what ranks need to reach it."""

    store: Any
    port: int
    token: str

    def env(self) -> dict[str, str]:
        return {"CUCO_STORE_PORT": str(self.port), "CUCO_STORE_TOKEN": self.token}


def host_store(timeout_s: float = 300.0) -> HostedStore:
    """A TCPStore hosted by this (parent) process on 127.0.0.1 only, under a fresh token. Imports torch.distributed
    only. The listening socket is bound here and handed to torch (``master_listen_fd``): asked for a host, torch
    listens on every interface."""
    from torch.distributed import TCPStore  # torch is heavy: only to host a store

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        port = int(sock.getsockname()[1])
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"could not listen on 127.0.0.1 ({exc}); is the loopback interface up?") from None
    try:
        raw = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                       timeout=timedelta(seconds=timeout_s), master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the socket now (and closes it when the store goes)
    token = new_token()
    return HostedStore(sealed_store(raw, token), port, token)


def client_store(port: int, token: str, timeout_s: float = 300.0) -> Any:
    """A rank's connection to the parent's store, sealing with ``token``."""
    from torch.distributed import TCPStore  # torch is heavy: only to reach the store

    raw = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return sealed_store(raw, token)


@dataclass
class Isolation:
    """How a world's ranks are kept from other processes' /proc (module docstring, 2. and 3.)."""

    pid_namespace: bool
    parent_undumpable: bool
    note: str

    def provenance(self) -> dict[str, Any]:
        return asdict(self)


def mark_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on this process; False where that is not possible (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass
class _Namespace:
    """A world's PID namespace: the holder (``unshare`` and, under it, pid 1) and the pipe that keeps it alive."""

    holder: subprocess.Popen[bytes]
    life_fd: int
    tools: dict[str, str]  # name -> absolute path (NS_TOOLS)

    def enter(self, cwd: Path) -> list[str]:
        """The argv prefix that runs a command inside, in ``cwd``, without CAP_SYS_ADMIN."""
        h = self.holder.pid
        return [self.tools["nsenter"], f"--pid=/proc/{h}/ns/pid_for_children", f"--mount=/proc/{h}/ns/mnt",
                f"--wd={cwd}", "--", self.tools["setpriv"], "--bounding-set=-sys_admin", "--"]

    def end(self) -> None:
        """Close the pipe (pid 1 exits, the kernel kills what is left inside), then reap the holder."""
        try:
            os.close(self.life_fd)
        except OSError:
            pass
        try:
            self.holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.holder.kill()  # unshare --kill-child takes pid 1, and the kernel the rest, with it
            try:
                self.holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # a process stuck in the driver holds the namespace; it ends when that process does


def _open_namespace(log_dir: Path) -> tuple[_Namespace | None, str]:
    """A fresh PID namespace with its own /proc, or (None, why not)."""
    if os.geteuid() != 0:
        return None, ("not root: no PID namespace; the parent is non-dumpable, so ranks cannot read its /proc "
                      "environ or memory, but other processes of this user (the shell, the notebook server) stay "
                      "readable")
    tools = {t: shutil.which(t) or "" for t in NS_TOOLS}
    missing = [t for t, path in tools.items() if not path]
    if missing:
        return None, f"no PID namespace ({', '.join(missing)} not found): ranks can read every process's /proc"
    life_r, life_w = os.pipe()
    ready_r, ready_w = os.pipe()
    log = open(log_dir / "namespace.log", "wb")
    try:
        holder = subprocess.Popen(
            [tools["unshare"], "--pid", "--fork", "--mount-proc", "--kill-child", "--", sys.executable, "-c", _HOLDER,
             str(life_r), str(ready_w)],
            env={"PATH": os.environ.get("PATH", os.defpath)}, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, pass_fds=(life_r, ready_w), start_new_session=True)
    except OSError as exc:
        for fd in (life_r, life_w, ready_r, ready_w):
            os.close(fd)
        return None, f"no PID namespace (unshare: {exc}): ranks can read every process's /proc"
    finally:
        log.close()
    os.close(life_r)
    os.close(ready_w)
    try:
        up = bool(select.select([ready_r], [], [], 10.0)[0]) and os.read(ready_r, 1) == b"1"
    finally:
        os.close(ready_r)
    if not up:
        os.close(life_w)
        holder.kill()
        holder.wait(timeout=5)
        why = _tail(log_dir / "namespace.log", 300).strip() or f"exit code {holder.returncode}"
        return None, f"no PID namespace (unshare failed: {why}): ranks can read every process's /proc"
    return _Namespace(holder, life_w, tools), ("ranks run in their own PID namespace with a private /proc, "
                                               "CAP_SYS_ADMIN dropped")


def _world_tmpdir(scratch: Path) -> Path:
    tmp = Path(scratch) / "tmp"
    if len(str(tmp.resolve())) > _MAX_TMPDIR:
        return Path(tempfile.mkdtemp(prefix="cuco-rank-tmp-"))
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


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

    procs: list[subprocess.Popen[bytes]]
    log_dir: Path
    pgids: list[int]
    cwd: Path
    isolation: Isolation = field(default_factory=lambda: Isolation(False, False, "not recorded"))
    namespace: _Namespace | None = None
    own_tmp: Path | None = None  # a TMPDIR outside the scratch dir (its path was too long), removed on kill
    started: float = field(default_factory=time.monotonic)
    killed: bool = False

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
        """SIGTERM to every rank's process group, SIGKILL after ``grace_s``; reaps every rank and ends the
        world's PID namespace (with anything still in it). Idempotent."""
        if self.killed:
            return
        self.killed = True
        # In a namespace, a rank is nsenter's child: signalled through their shared group, nsenter would die first
        # and leave the rank a zombie for the machine's init to reap, which holds up the namespace's end. So the
        # ranks are signalled themselves, nsenter reaps them, and the namespace's end takes their descendants.
        ranks = self._namespace_ranks()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in ranks or ():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for g in self.pgids if ranks is None else ():
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            if sig == signal.SIGTERM and self.wait(grace_s) and _until(lambda: self._settled(ranks), grace_s):
                break
        for p in self.procs:  # a rank that left the group still gets its own signal
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.namespace is not None:  # ends whatever is left inside, however it left its group
            self.namespace.end()
            self.namespace = None
        else:  # grandchildren in the group are gone after SIGKILL; wait a moment so callers can check
            _until(lambda: self._settled(None), 2.0)
        if self.own_tmp is not None:
            shutil.rmtree(self.own_tmp, ignore_errors=True)
            self.own_tmp = None

    def _namespace_ranks(self) -> list[int] | None:
        """Host pids of the ranks inside a PID namespace (nsenter's children); None outside one, or where a
        running nsenter's child is not known (then the groups are signalled)."""
        if self.namespace is None:
            return None
        ranks = []
        for p in self.procs:
            children = _read(f"/proc/{p.pid}/task/{p.pid}/children").split()
            if not children and p.poll() is None:
                return None
            ranks += [int(c) for c in children]
        return ranks

    def _settled(self, ranks: list[int] | None) -> bool:
        """Every process has exited: the given rank processes, or (None) every member of the groups."""
        if ranks is None:
            return not any(_group_alive(g) for g in self.pgids)
        return all(_exited(pid) for pid in ranks)

    def tails(self, limit: int = 4000) -> dict[str, str]:
        return {f"rank{r}": _tail(self.log_dir / f"rank{r}.log", limit) for r in range(self.world)}


def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _exited(pid: int) -> bool:
    """Gone, or a zombie (dead, waiting to be reaped)."""
    stat = _read(f"/proc/{pid}/stat")
    return not stat or stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


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
           base_env: Mapping[str, str] | None = None, local_ranks: Sequence[int] | None = None,
           pid_namespace: bool = True) -> RankGroup:
    """Start ``argv`` as ``world`` rank processes. ``scratch/run`` is their cwd and ``scratch/tmp`` their TMPDIR
    (nothing else is writable by design: not the store, not the build cache); logs go to ``scratch/logs``. Each
    rank starts its own session, so ``RankGroup.kill`` ends all of them and their children. With
    ``pid_namespace`` (and where possible, see the module docstring) the world gets its own PID namespace;
    ``RankGroup.isolation`` says what was done."""
    if world < 1:
        raise ValueError(f"launch: world size must be >= 1, got {world}")
    run_dir = Path(scratch) / "run"
    log_dir = Path(scratch) / "logs"
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    tmp = _world_tmpdir(Path(scratch))
    undumpable = mark_undumpable()
    ns, note = _open_namespace(log_dir) if pid_namespace else (None, "no PID namespace (not requested)")
    isolation = Isolation(ns is not None, undumpable, note)
    prefix = ns.enter(run_dir) if ns is not None else []
    procs: list[subprocess.Popen[bytes]] = []

    def group() -> RankGroup:
        return RankGroup(procs, log_dir, [p.pid for p in procs], run_dir, isolation, ns,
                         None if tmp.parent == Path(scratch) else tmp)

    try:
        for r in range(world):
            extra = {"TMPDIR": str(tmp), **(extra_env or {})}
            if per_rank_env:
                extra.update(per_rank_env[r])
            env = rank_env(r, world, master_port, base=base_env, extra=extra,
                           local_rank=None if local_ranks is None else local_ranks[r])
            log = open(log_dir / f"rank{r}.log", "wb")
            try:
                p = subprocess.Popen([*prefix, *argv], cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
            finally:
                log.close()
            procs.append(p)
    except BaseException:
        group().kill(grace_s=0.5)
        raise
    return group()
