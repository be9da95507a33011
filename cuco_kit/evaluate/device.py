"""What this machine is, asked without CUDA: GPUs as nvidia-smi lists them, the driver's CUDA version, the git
revision of the kit, and the environment that keeps NVLink multicast off.

Standard library only, so the parent process (a notebook kernel, the CLI, a search) can ask "is there a GPU?"
without importing torch and without creating a CUDA context; only rank processes touch CUDA.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# NVLink multicast stays off in every process the kit starts on a GPU machine. The one source of truth is this
# file; shell entry points read the same KEY=VALUE lines (`set -a; . cuco_kit/evaluate/multicast_off.env`).
MULTICAST_OFF_FILE = Path(__file__).with_name("multicast_off.env")


def _read_env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


MULTICAST_OFF: dict[str, str] = _read_env_file(MULTICAST_OFF_FILE)

_GPU_FIELDS = ("index", "name", "driver_version", "memory.total", "memory.used", "compute_cap", "uuid")


def detect_gpu(timeout_s: float = 20.0) -> list[dict[str, str]]:
    """GPUs as nvidia-smi lists them (index, name, driver, memory, compute capability); [] when there is none
    or the driver does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        p = subprocess.run([exe, f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=timeout_s)
    except (subprocess.TimeoutExpired, OSError):
        return []
    if p.returncode != 0:
        return []
    out = []
    for line in p.stdout.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == len(_GPU_FIELDS):
            out.append(dict(zip(_GPU_FIELDS, parts)))
    return out


def gpu_present() -> bool:
    """nvidia-smi lists at least one GPU. The one check every caller uses; no CUDA context is created."""
    return bool(detect_gpu())


def describe_gpus(gpus: list[dict[str, str]] | None = None) -> str:
    """"2 x NVIDIA H200" for the GPUs nvidia-smi lists; "" when there is none."""
    gpus = detect_gpu() if gpus is None else gpus
    if not gpus:
        return ""
    names = sorted({str(g.get("name") or "GPU") for g in gpus})
    return f"{len(gpus)} x {', '.join(names)}"


def driver_cuda_version(timeout_s: float = 20.0) -> str | None:
    """The CUDA version the driver supports, as nvidia-smi prints it; None without a driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe], capture_output=True, text=True, timeout=timeout_s)
    except (subprocess.TimeoutExpired, OSError):
        return None
    m = re.search(r"CUDA Version:\s*([\d.]+)", p.stdout)
    return m.group(1) if m else None


def git_revision() -> str:
    """The kit's short git revision, "+dirty" when tracked files changed; "unknown" outside a checkout."""
    try:
        p = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        rev = p.stdout.strip() if p.returncode == 0 else "unknown"
        d = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10)
        return rev + ("+dirty" if d.returncode == 0 and d.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
