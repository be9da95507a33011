"""One-shot probe of a GPU machine: what the harness relies on, checked in one run.

Run on a GPU machine, from the repository root: `PYTHONPATH=. python3 scripts/remote_gpu/probe_device.py OUTDIR`.
Prints one line per fact and writes OUTDIR/probe.json. Every child it starts keeps NVLink multicast off.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# The kit's one multicast-off environment, read from its KEY=VALUE file (this probe imports nothing of the kit).
SAFE_ENV = dict(line.split("=", 1) for line in
                (Path(__file__).resolve().parents[2] / "cuco_kit/evaluate/multicast_off.env").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
os.environ.update(SAFE_ENV)
facts: dict[str, object] = {}


def sh(cmd: str, timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return "TIMEOUT"


def fact(key: str, value: object) -> None:
    facts[key] = value
    print(f"{key}: {value}", flush=True)


fact("nvidia_smi", sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"))
fact("python", sys.version.split()[0])
fact("nvcc", sh("nvcc --version | tail -1"))
fact("mps_control", sh("which nvidia-cuda-mps-control"))
fact("compute_sanitizer", sh("which compute-sanitizer"))
import nvidia.nccl  # noqa: E402 - imported after the facts above, so they print even where it is missing

nccl_dir = Path(list(nvidia.nccl.__path__)[0])
fact("nccl_dir", str(nccl_dir))
fact("nccl_header", sh(f"grep 'define NCCL_VERSION_CODE' {nccl_dir}/include/nccl.h"))
try:
    import nvidia.cu13

    fact("cu13_lib", sh(f"ls {list(nvidia.cu13.__path__)[0]}/lib | head -30"))
except Exception as e:  # noqa: BLE001 - whatever stops the listing is itself the fact recorded
    fact("cu13_lib", repr(e))
fact("nvidia_pkgs", sh("ls $(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia"))

import torch  # noqa: E402 - imported after the facts above, so they print even where it is missing

fact("torch", torch.__version__)
fact("torch_nccl", torch.cuda.nccl.version())
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
maps = Path("/proc/self/maps").read_text().splitlines()
fact("loaded_libs", sorted({m.split()[-1] for m in maps if "cublas" in m or "nccl" in m or "cudart" in m}))
fact("blas_handle", hex(torch.cuda.current_blas_handle()))
p = torch.cuda.get_device_properties(0)
fact("props", {"sm": p.multi_processor_count, "l2": getattr(p, "L2_cache_size", None), "name": p.name})

# NCCL through ctypes at world size 1: comm, ncclMemAlloc, window registration.
lib = ctypes.CDLL(str(nccl_dir / "lib" / "libnccl.so.2"))
v = ctypes.c_int()
lib.ncclGetVersion(ctypes.byref(v))
fact("nccl_runtime", v.value)


class UID(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


uid = UID()
comm = ctypes.c_void_p()
t0 = time.time()
r1 = lib.ncclGetUniqueId(ctypes.byref(uid))
r2 = lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
ptr = ctypes.c_void_p()
r3 = lib.ncclMemAlloc(ctypes.byref(ptr), ctypes.c_size_t(1 << 24))
win = ctypes.c_void_p()
r4 = lib.ncclCommWindowRegister(comm, ptr, ctypes.c_size_t(1 << 24), ctypes.byref(win), 1)
fact("nccl_ctypes", {"uid": r1, "init": r2, "memalloc": r3, "winreg": r4, "win": bool(win.value),
                     "seconds": round(time.time() - t0, 2)})
lib.ncclCommWindowDeregister(comm, win)
lib.ncclMemFree(ptr)
lib.ncclCommDestroy(comm)

# Two processes sharing the GPU through torch symmetric memory, with and without MPS.
child = textwrap.dedent(
    """
    import os, sys, time, torch, torch.distributed as dist
    import torch.distributed._symmetric_memory as symm
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = symm.empty(1 << 20, device="cuda", dtype=torch.float32)
    h = symm.rendezvous(t, dist.group.WORLD.group_name)
    t.fill_(rank + 1)
    torch.cuda.synchronize(); dist.barrier()
    peer = h.get_buffer((rank + 1) % world, (1 << 20,), torch.float32)
    ok = bool((peer == ((rank + 1) % world) + 1).all().item())
    ptrs = list(h.buffer_ptrs)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize(); dist.barrier(); t0 = time.time()
    for _ in range(20): y = x @ x
    torch.cuda.synchronize(); dt = (time.time() - t0) / 20
    dist.barrier()
    print("RESULT", rank, ok, len(ptrs), round(dt * 1e3, 3), flush=True)
    dist.destroy_process_group()
    """
)


def run_pair(env_extra: dict[str, str]) -> str:
    port = 29000 + int(time.time()) % 1000
    procs = []
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(child)
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES="1", **SAFE_ENV, **env_extra)
        procs.append(subprocess.Popen([sys.executable, f.name], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    out = []
    for pr in procs:
        try:
            o, _ = pr.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(pr.pid, 9)
            o = "TIMEOUT"
        out.append("\n".join(line for line in o.splitlines()
                              if "RESULT" in line or "Error" in line or "error" in line)[-600:])
    return " | ".join(out)


t0 = time.time()
fact("symm_no_mps", run_pair({}))
fact("symm_no_mps_s", round(time.time() - t0, 1))
pipe = tempfile.mkdtemp(prefix="mps-pipe-")
logd = tempfile.mkdtemp(prefix="mps-log-")
menv = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=logd)
r = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=menv, capture_output=True, text=True)
fact("mps_start", (r.returncode, r.stdout + r.stderr))
time.sleep(1)
t0 = time.time()
fact("symm_mps", run_pair({"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logd,
                           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}))
fact("symm_mps_s", round(time.time() - t0, 1))
q = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=menv, capture_output=True, text=True)
fact("mps_stop", (q.returncode, q.stdout + q.stderr))
time.sleep(1)
fact("mps_left", sh("pgrep -a nvidia-cuda-mps || true"))
fact("mps_log", sh(f"tail -5 {logd}/control.log 2>/dev/null"))

out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out.mkdir(parents=True, exist_ok=True)
(out / "probe.json").write_text(json.dumps(facts, indent=1, default=str))
