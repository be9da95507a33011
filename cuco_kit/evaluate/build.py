"""L1: build a candidate into a shared library with nvcc, cached by content hash.

A candidate is one ``.cu`` file. The same source builds for two backends: ``nccl`` (the real NCCL, linked against
the wheel's ``libnccl.so.2``) and ``symm`` (``-DCUCO_BUILD_SYMM=1``: ``cuco_lsa.h`` swaps in ``lsa_compat.h`` for
the device API, and ``runtime/symm_nccl/`` comes first on the include path, so ``<nccl.h>`` is the host API over
the ranks' shared memory; no NCCL linked). cuBLAS is linked by soname (``libcublas.so.13``) with an rpath into the
wheel, so the candidate binds to the same libraries torch already loaded in the rank worker.

The cache key covers everything that changes the binary: the code, the backend, the exact nvcc command, the
nvcc version, the NCCL header version and the runtime headers' bytes. A finished build is moved into the cache
with an atomic rename, so a reader sees either nothing or a complete ``.so``; the compiler log sits next to it.
Failed builds leave a log but never a ``.so``, and are not cached (a timeout may be transient). Threads and
processes sharing a cache (several evaluators, the gpu tier's parallel tests) build a key once: a builder holds
an flock on ``<key>.lock`` while nvcc runs, and the others wait for it and then find the ``.so``.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from cuco_kit.errors import BadInput, CucoError

BACKENDS: tuple[str, ...] = ("nccl", "symm")
RUNTIME_DIR = Path(__file__).resolve().parents[1] / "runtime"
TOOLKIT_INCLUDE = Path("/usr/local/cuda/include")
# `-arch=sm_90a` also runs a plain sm_90 pass on some nvcc versions, which rejects wgmma; -gencode does not.
DEFAULT_GENCODE: tuple[str, ...] = ("-gencode=arch=compute_90a,code=sm_90a",)
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo")
SYMM_DEFINE = "-DCUCO_BUILD_SYMM=1"  # not CUCO_BACKEND_SYMM: that is an enumerator in cuco_abi.h
SYMM_NCCL_SUBDIR = "symm_nccl"  # runtime/symm_nccl/nccl.h: host NCCL under symm, first on that include path
STRESS_DEFINE = "-DCUCO_STRESS=1"  # runtime/cuco_stress.h: random pauses in the signalling primitives
NCCL_SONAME = "libnccl.so.2"
CUBLAS_SONAME = "libcublas.so.13"
_BACKENDS_LINE = re.compile(r"^\s*//\s*cuco:\s*backends\s*=\s*([\w,\s]+)$", re.MULTILINE)
_HOST_NCCL_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]nccl\.h[>\"]", re.MULTILINE)
_RUNTIME_PRIMITIVES_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]cuco_lsa\.h[>\"]", re.MULTILINE)


def _nvidia_wheel_dir(name: str) -> Path | None:
    """The folder of an installed ``nvidia.<name>`` wheel (e.g. nccl, cu13), found without importing CUDA."""
    try:
        spec = importlib.util.find_spec(f"nvidia.{name}")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for loc in spec.submodule_search_locations or []:
        if Path(loc).is_dir():
            return Path(loc)
    if spec.origin:
        return Path(spec.origin).parent
    return None


def _wheel_subdir(name: str, sub: str) -> Path | None:
    d = _nvidia_wheel_dir(name)
    return d / sub if d is not None and (d / sub).is_dir() else None


def _default_nvcc() -> str:
    return shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@dataclass
class BuildConfig:
    """How candidates are compiled. Defaults find nvcc on PATH and the NCCL / cuBLAS wheels torch uses."""

    nvcc: str = field(default_factory=_default_nvcc)
    gencode: tuple[str, ...] = DEFAULT_GENCODE
    nccl_include: Path | None = field(default_factory=lambda: _wheel_subdir("nccl", "include"))
    nccl_lib: Path | None = field(default_factory=lambda: _wheel_subdir("nccl", "lib"))
    cublas_include: Path | None = field(default_factory=lambda: _wheel_subdir("cu13", "include"))
    cublas_lib: Path | None = field(default_factory=lambda: _wheel_subdir("cu13", "lib"))
    toolkit_include: Path = TOOLKIT_INCLUDE
    runtime_dir: Path = RUNTIME_DIR
    # A workload's own frozen headers (*.cuh in its folder, e.g. a kernel its seeds and baseline share): on the
    # include path and in the cache key. Set through for_workload(); candidates stay one file plus these.
    workload_include: Path | None = None
    extra_flags: tuple[str, ...] = ()
    timeout_s: float = 300.0

    def include_dirs(self) -> list[Path]:
        dirs = [self.runtime_dir, self.workload_include, self.nccl_include, self.cublas_include,
                self.toolkit_include]
        return [d for d in dirs if d is not None]


def for_workload(cfg: BuildConfig | None, directory: str | Path) -> BuildConfig:
    """``cfg`` with the workload's folder on the include path when it ships headers (``*.cuh``); otherwise
    ``cfg`` unchanged, so workloads without headers keep their build commands and cache keys."""
    cfg = cfg or BuildConfig()
    d = Path(directory)
    if not any(d.glob("*.cuh")):
        return cfg
    return dataclasses.replace(cfg, workload_include=d.resolve())


def has_stress_hooks(code: str, backend: str) -> bool:
    """Whether a source's build for ``backend`` has waits its stress build instruments: the runtime's signalling
    primitives (cuco_lsa.h), or, under symm, host NCCL calls (served by runtime/symm_nccl/nccl.h, whose flag waits
    pause the same way). Without them a stress build would be the same program."""
    if _RUNTIME_PRIMITIVES_INCLUDE.search(code):
        return True
    return backend == "symm" and _HOST_NCCL_INCLUDE.search(code) is not None


def stress_config(cfg: BuildConfig | None) -> BuildConfig:
    """``cfg`` for the stress build of a source (at two ranks and more: its L2 trials run with the pauses on, then
    the same library is timed with them off): the same command plus STRESS_DEFINE, cached under its own key."""
    cfg = cfg or BuildConfig()
    if STRESS_DEFINE in cfg.extra_flags:
        return cfg
    return dataclasses.replace(cfg, extra_flags=(*cfg.extra_flags, STRESS_DEFINE))


@dataclass
class BuildResult:
    ok: bool
    so_path: Path | None
    log: str
    seconds: float
    cached: bool
    key: str


def supported_backends(code: str) -> tuple[str, ...]:
    """Backends a source can be built for. A ``// cuco: backends=nccl`` (or ``=nccl,symm``) line wins; otherwise
    every source builds for both: ``cuco_lsa.h`` candidates, copy-engine seeds, and host NCCL calls
    (``<nccl.h>``), which symm serves through runtime/symm_nccl/nccl.h."""
    m = _BACKENDS_LINE.search(code)
    if m:
        names = tuple(b.strip() for b in m.group(1).split(",") if b.strip())
        unknown = [b for b in names if b not in BACKENDS]
        if unknown or not names:
            raise BadInput(f"'// cuco: backends=' names {unknown or 'nothing'}; use a comma list of {BACKENDS}")
        return names
    return BACKENDS


def nvcc_command(src: str | Path, out: str | Path, backend: str, cfg: BuildConfig | None = None) -> list[str]:
    """The full nvcc argument list that builds ``src`` into the shared library ``out`` for ``backend``."""
    cfg = cfg or BuildConfig()
    if backend not in BACKENDS:
        raise BadInput(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    cmd = [cfg.nvcc, *BASE_FLAGS, *cfg.gencode]
    if backend == "symm":
        # before every other include dir: <nccl.h> must be the compat header, not the wheel's
        cmd += [SYMM_DEFINE, f"-I{Path(cfg.runtime_dir) / SYMM_NCCL_SUBDIR}"]
    cmd += [f"-I{d}" for d in cfg.include_dirs()]
    cmd += list(cfg.extra_flags)
    cmd += [str(src), "-o", str(out)]
    if backend == "nccl":
        if cfg.nccl_lib is None:
            raise CucoError("NCCL library not found: install nvidia-nccl-cu13 (pip install -e '.[gpu]') or set "
                            "BuildConfig.nccl_lib")
        cmd += [f"-L{cfg.nccl_lib}", f"-l:{NCCL_SONAME}", "-Xlinker", f"-rpath={cfg.nccl_lib}"]
    if cfg.cublas_lib is not None and (cfg.cublas_lib / CUBLAS_SONAME).exists():
        cmd += [f"-L{cfg.cublas_lib}", f"-l:{CUBLAS_SONAME}", "-Xlinker", f"-rpath={cfg.cublas_lib}"]
    else:
        cmd.append("-lcublas")
    # Unresolved symbols fail the build, not a later dlopen in a rank worker (a declared but undefined function).
    cmd += ["-Xlinker", "--no-undefined"]
    return cmd


# ---- versions ------------------------------------------------------------------------------------------


def nccl_header_version(include_dir: str | Path) -> int:
    """``NCCL_VERSION_CODE`` as defined in ``<include_dir>/nccl.h`` (22809 for 2.28.9)."""
    header = Path(include_dir) / "nccl.h"
    try:
        text = header.read_text(errors="replace")
    except OSError as e:
        raise CucoError(f"cannot read {header}: {e.strerror}; install nvidia-nccl-cu13 or fix BuildConfig") from e
    m = re.search(r"^\s*#\s*define\s+NCCL_VERSION_CODE\s+(\d+)", text, re.MULTILINE)
    if not m:
        raise CucoError(f"{header} defines no NCCL_VERSION_CODE; is it an NCCL header?")
    return int(m.group(1))


def nccl_version_string(code: int) -> str:
    """22809 -> '2.28.9'; codes below 10000 use NCCL's old X*1000+Y*100+Z form."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def check_nccl_version(header_code: int, runtime_code: int) -> None:
    """Refuse to run a candidate whose NCCL headers differ from the loaded library: the device API's structs
    (ncclDevComm, windows) are inlined into the candidate, so a mismatch corrupts memory instead of failing."""
    if header_code != runtime_code:
        raise CucoError(
            f"NCCL version mismatch: candidates are built against headers {nccl_version_string(header_code)} "
            f"(NCCL_VERSION_CODE {header_code}) but the loaded libnccl is {nccl_version_string(runtime_code)} "
            f"({runtime_code}); install the matching nvidia-nccl wheel or point BuildConfig.nccl_include at "
            f"headers of the loaded library")


@lru_cache(maxsize=8)
def _nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CucoError(f"cannot run {nvcc} --version ({e}); install the CUDA toolkit or set BuildConfig.nvcc") \
            from None
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else f"rc={out.returncode}"


def _headers_digest(cfg: BuildConfig) -> str:
    """Bytes of the runtime headers (symm_nccl/ included) plus the NCCL version: a header edit must invalidate
    cached builds."""
    h = hashlib.sha256()
    runtime = Path(cfg.runtime_dir)
    headers = [(p.relative_to(runtime).as_posix(), p) for p in sorted(runtime.rglob("*.h"))]
    if cfg.workload_include is not None:
        headers += [(p.name, p) for p in sorted(Path(cfg.workload_include).glob("*.cuh"))]
    for name, p in headers:
        h.update(name.encode())
        h.update(p.read_bytes())
    if cfg.nccl_include is not None and (Path(cfg.nccl_include) / "nccl.h").exists():
        h.update(str(nccl_header_version(cfg.nccl_include)).encode())
    return h.hexdigest()


def cache_key(code: str, backend: str, cfg: BuildConfig) -> str:
    """sha256 over code, backend, the nvcc command (with placeholder paths), nvcc and header versions."""
    cmd = nvcc_command("candidate.cu", "candidate.so", backend, cfg)
    h = hashlib.sha256()
    for part in (code, backend, "\0".join(cmd), _nvcc_version(cfg.nvcc), _headers_digest(cfg)):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


# ---- build ------------------------------------------------------------------------------------------------


def _run_nvcc(cmd: Sequence[str], cwd: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run nvcc in its own process group so a timeout also kills cicc/ptxas; rc None means timed out."""
    try:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    except OSError as e:
        return -1, f"cannot start {cmd[0]}: {e.strerror}"
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return None, (out or "") + f"\nnvcc timed out after {timeout_s:g} s and was killed"


@contextmanager
def _one_builder(cache: Path, key: str) -> Iterator[None]:
    """Hold the key's lock (flock: released by the kernel if the holder dies) while building it. Only saves the
    duplicate compile: the build is atomic without it."""
    with open(cache / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(code: str, backend: str, cfg: BuildConfig | None = None,
          cache_dir: str | Path | None = None) -> BuildResult:
    """Build ``code`` for ``backend`` into ``<cache_dir>/<key>.so`` unless that file exists already."""
    cfg = cfg or BuildConfig()
    cache = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "cuco" / "builds"
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    key = cache_key(code, backend, cfg)
    so_path = cache / f"{key}.so"
    log_path = cache / f"{key}.log"
    if so_path.exists():
        return BuildResult(True, so_path, _log(log_path), time.monotonic() - t0, True, key)
    with _one_builder(cache, key):
        if so_path.exists():  # another thread or process built it while this one waited
            return BuildResult(True, so_path, _log(log_path), time.monotonic() - t0, True, key)
        return _compile(code, backend, cfg, cache, key, t0)


def _log(log_path: Path) -> str:
    return log_path.read_text(errors="replace") if log_path.exists() else ""


def _compile(code: str, backend: str, cfg: BuildConfig, cache: Path, key: str, t0: float) -> BuildResult:
    so_path, log_path = cache / f"{key}.so", cache / f"{key}.log"
    work = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=cache))
    try:
        src, out = work / "candidate.cu", work / "candidate.so"
        src.write_text(code)
        cmd = nvcc_command(src.name, out.name, backend, cfg)
        rc, output = _run_nvcc(cmd, work, cfg.timeout_s)
        ok = rc == 0 and out.exists()
        log = f"$ {' '.join(cmd)}\n{output}"
        if rc == 0 and not out.exists():
            log += "\nnvcc exited 0 but wrote no shared library"
        # via this build's own folder: two threads building the same key never share a temporary file
        (work / "build.log").write_text(log)
        os.replace(work / "build.log", log_path)
        if ok:
            os.replace(out, so_path)  # last: the .so appearing means the build is complete
        return BuildResult(ok, so_path if ok else None, log, time.monotonic() - t0, False, key)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_file(path: str | Path, backend: str, cfg: BuildConfig | None = None,
               cache_dir: str | Path | None = None) -> BuildResult:
    """``build`` on a file's text; a missing or unreadable file is the user's error, said in one line."""
    p = Path(path)
    try:
        code = p.read_text()
    except OSError as e:
        raise BadInput(f"{p}: cannot read candidate ({e.strerror})") from e
    return build(code, backend, cfg, cache_dir)


def build_helpers(cache_dir: str | Path, cfg: BuildConfig | None = None) -> Path:
    """Build (or find cached) libcuco_harness.so, the harness's own device work inside a rank
    (runtime/harness_helpers.cu), with the same nvcc settings as candidates. The parent builds it; ranks load it."""
    res = build((RUNTIME_DIR / "harness_helpers.cu").read_text(), "nccl", cfg, cache_dir)
    if not res.ok or res.so_path is None:
        raise RuntimeError(f"building the harness helpers failed:\n{res.log[-3000:]}")
    return Path(res.so_path)
