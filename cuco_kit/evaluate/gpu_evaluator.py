"""GpuEvaluator: the evaluation cascade L0 (static) -> L1 (build) -> L2 (verify) -> L3 (bench) on real GPUs.

L0 and L1 run in this process (no CUDA). L2 and L3 run in warm rank workers (pool.py) that keep communicator,
windows and the flag region between candidates; the workload's seed is re-measured in the same world with the
same protocol for every request, so results are ratios. This process never creates a CUDA context.

Safe to call from a worker thread (one evaluation at a time per evaluator; a lock serialises callers).
"""
from __future__ import annotations

import atexit
import datetime as _dt
import json
import os
import shutil
import site
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import FLAG_SPEEDUP, EvalRequest, EvalResult, Level, Progress, Verdict
from cuco_kit.evaluate.build import BuildConfig, build, build_helpers, for_workload, nccl_header_version
from cuco_kit.evaluate.device import REPO_ROOT, detect_gpu, driver_cuda_version, git_revision
from cuco_kit.evaluate.mps import MpsDaemon, MpsState
from cuco_kit.evaluate.pool import GroupSpec, PoolConfig, WorkerError, WorkerGroup, WorkerPool
from cuco_kit.evaluate.stats import FLUSH_BYTES, iteration_stats, speedup_ci
from cuco_kit.workload import Workload, load_workload

LEVEL_ORDER = {"L0": 0, "L1": 1, "L2": 2, "L3": 3}


@dataclass
class EvaluatorConfig:
    """Knobs of the GPU evaluator; the defaults are the design's numbers."""

    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "cuco" / "builds")
    scratch_root: Path | None = None  # rank working dirs and logs (default: a fresh temp dir)
    recycle_every: int = 25  # evaluations per warm world before it is replaced
    flag_words: int = 65536  # candidate-visible flag words per rank (the first 4096 belong to the runtime)
    flush_bytes: int = FLUSH_BYTES
    use_mps: bool = True  # symm: run ranks under MPS (started only when no daemon answers)
    mps_thread_percentage: int | None = None  # per rank; None = round(100 / world)
    jitter_us: float = 200.0  # max random per-rank delay before each L2 trial (world > 1)
    seed_step_limit_s: float = 30.0  # watchdog for the seed itself (no reference time yet)
    min_step_limit_s: float = 2.0  # watchdog: max(min_step_limit_s, step_limit_factor x seed step)
    step_limit_factor: float = 50.0
    setup_limit_s: float = 60.0
    start_timeout_s: float = 300.0
    request_timeout_s: float = 900.0
    run_l0: bool = True
    build: BuildConfig | None = None  # None = its defaults

    def pool_config(self) -> PoolConfig:
        return PoolConfig(recycle_every=self.recycle_every, start_timeout_s=self.start_timeout_s)


# ------------------------------------------------------------------------------------------------ L0 / L1

def run_l0(code: str, parent_code: str | None) -> tuple[bool | None, list[str], str]:
    """(ok, reasons, note). ok None = L0 could not run here (tree-sitter missing on the GPU image): the
    evaluation goes on and says so."""
    try:
        from cuco_kit.static_check import check_candidate
    except ModuleNotFoundError as exc:
        if "tree_sitter" in str(exc):
            return None, [], ("L0 not run: tree-sitter is not installed on this machine (pip install "
                              "tree-sitter tree-sitter-cuda); the host-code whitelist was not checked")
        raise
    rep = check_candidate(code, parent_code)
    return bool(rep.ok), list(rep.reasons), ""


def _emit(progress: Progress | None, **event: Any) -> None:
    if progress is not None:
        try:
            progress(event)
        except Exception:  # noqa: BLE001 - a broken progress callback must not break an evaluation
            pass


def _site_prefixes() -> list[tuple[str, str]]:
    dirs = [(str(REPO_ROOT), "<repo>")]
    dirs += [(d, "<site-packages>") for d in (site.getsitepackages() + [site.getusersitepackages()]) if d]
    dirs += [(tempfile.gettempdir() + os.sep, "<tmp>/"), (str(Path.home()), "<home>")]
    return sorted(dirs, key=lambda d: -len(d[0]))


def scrub(text: str) -> str:
    """Logs and provenance end up in committed stores and benchmarks: no machine paths there."""
    for prefix, name in _site_prefixes():
        text = text.replace(prefix, name)
    return text


def _tail(text: str, n: int = 4000) -> str:
    return scrub(text if len(text) <= n else "...\n" + text[-n:])


# ------------------------------------------------------------------------------------------------ evaluator

class GpuEvaluator:
    """Implements api.Evaluator on the local GPU(s)."""

    def __init__(self, config: EvaluatorConfig | None = None) -> None:
        self.cfg = config or EvaluatorConfig()
        self.root = Path(self.cfg.scratch_root or tempfile.mkdtemp(prefix="cuco-eval-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.pool = WorkerPool(self.cfg.pool_config(), self.root / "ranks")
        self._mps: MpsDaemon | None = None
        self._lock = threading.Lock()
        self._helpers: Path | None = None
        self._gpus: list[dict[str, str]] | None = None
        self.history: list[dict[str, Any]] = []  # per evaluation: seconds, warm or cold (overhead report)
        atexit.register(self.close)

    # ----------------------------------------------------------------------------------------------- public
    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        with self._lock:
            t0 = time.monotonic()
            res = self._evaluate(request, progress)
            res.provenance.setdefault("eval_seconds", round(time.monotonic() - t0, 3))
            return res

    def prebuild(self, request: EvalRequest) -> bool:
        """L1 for a request ahead of its evaluation (thread-safe, no GPU): the search calls this for upcoming
        candidates so nvcc runs while the GPU evaluates. Returns whether the build succeeded (or was cached)."""
        cfg = for_workload(self.cfg.build, request.workload_dir)
        return bool(build(request.candidate_code, request.backend, cfg, self.cfg.cache_dir).ok)

    def sanitize(self, request: EvalRequest, so_path: str | Path | None = None, *,
                 timeout_s: float = 300.0) -> str:
        """Run `request`'s candidate once (one trial, one iteration) at world size 1 in a fresh rank worker under
        compute-sanitizer memcheck and return what the rank printed (the sanitizer's report is in it).

        A fresh worker, never a warm one: the tool must see the process from its start, and a faulted context is
        unusable anyway. Slow (the tool instruments every kernel, torch's and NCCL's too), so it is for naming
        the kernel behind an illegal memory access, not for the search loop."""
        exe = shutil.which("compute-sanitizer") or next(
            (str(p) for p in (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer",)
             if p.exists()), None)
        if exe is None:
            raise RuntimeError("compute-sanitizer is not on PATH (it ships with the CUDA toolkit, in its bin/)")
        req = EvalRequest(**{**request.__dict__, "world_size": 1})
        wl = load_workload(req.workload_dir)
        params = wl.resolve(req.params)
        if so_path is None:
            b = build(req.candidate_code, req.backend, for_workload(self.cfg.build, wl.directory),
                      self.cfg.cache_dir)
            if not b.ok:
                return "build failed:\n" + _tail(b.log)
            so_path = b.so_path
        scratch = Path(tempfile.mkdtemp(prefix="sanitize-", dir=self.root))
        spec = self._group_spec(req, params, scratch)
        # memcheck only: racecheck/synccheck would flag the intended cross-rank flag protocol
        spec.wrapper = [exe, "--tool", "memcheck", "--print-limit", "20", "--target-processes", "all"]
        group = WorkerGroup(spec, PoolConfig(start_timeout_s=timeout_s))
        note = ""
        try:
            group.start()
            group.request({"op": "eval", "trials": 1, "warmup": 0, "iters": 1, "verify_every": 1, "seed": req.seed,
                           "jitter_us": 0.0, "setup_limit_s": timeout_s, "so_path": str(so_path),
                           "role": "candidate", "step_limit_s": timeout_s}, timeout_s=timeout_s)
        except WorkerError as exc:
            note = f"[the sanitized run ended: {exc.kind}: {exc}]\n" + "\n".join(exc.logs.values())
        finally:
            group.close()  # first: the tool prints its summary when the rank exits
        logs = group.tails(limit=20000)
        return scrub("\n".join([*logs.values(), note]))

    def close(self) -> None:
        """End every warm world and stop the MPS daemon if we started it (idempotent)."""
        try:
            self.pool.close()
        finally:
            if self._mps is not None:
                self._mps.stop()

    # ---------------------------------------------------------------------------------------------- cascade
    def _evaluate(self, req: EvalRequest, progress: Progress | None) -> EvalResult:
        wl = load_workload(req.workload_dir)  # misuse (no workload) raises BadInput
        params = wl.resolve(req.params)
        if req.backend not in ("nccl", "symm"):
            raise BadInput(f"backend {req.backend!r}: use nccl or symm")
        prov = self._base_provenance(req)
        logs: dict[str, str] = {}
        notes: list[str] = []
        # L0
        if self.cfg.run_l0:
            _emit(progress, level="L0", rank=None, step="static", done=0, total=1)
            ok, reasons, note = run_l0(req.candidate_code, req.parent_code)
            if note:
                notes.append(note)
            if ok is False:
                return EvalResult("L0", "fail", "L0: " + "; ".join(reasons), logs={"L0": "\n".join(reasons)},
                                  provenance=prov)
            _emit(progress, level="L0", rank=None, step="static", done=1, total=1)
        # L1
        _emit(progress, level="L1", rank=None, step="build", done=0, total=1)
        bcfg = for_workload(self.cfg.build, wl.directory)
        b = build(req.candidate_code, req.backend, bcfg, self.cfg.cache_dir)
        logs["build"] = _tail(b.log)
        prov["build_seconds"] = round(b.seconds, 3)
        prov["build_cached"] = b.cached
        if not b.ok or b.so_path is None:
            return EvalResult("L1", "fail", "L1: build failed (see logs['build'])", logs=logs, provenance=prov)
        _emit(progress, level="L1", rank=None, step="build", done=1, total=1)
        gpus = self._detect()
        if not gpus:
            prov["notes"] = notes
            return EvalResult("L1", "unavailable", "no GPU: L2/L3 not evaluated", badge="unmeasured", logs=logs,
                              provenance=prov)
        if req.backend == "nccl" and req.world_size > len(gpus):
            return EvalResult("L1", "unavailable", f"nccl backend: world size {req.world_size} needs "
                              f"{req.world_size} GPUs, this machine has {len(gpus)} (use --backend symm)",
                              badge="unmeasured", logs=logs, provenance=prov)
        # seed build
        seed_so = None
        if req.measure_seed:
            seed_code = wl.seed_for(req.backend).read_text()
            sb = build(seed_code, req.backend, bcfg, self.cfg.cache_dir)
            if not sb.ok:
                logs["seed_build"] = _tail(sb.log)
                return EvalResult("L1", "error", f"the workload's {req.backend} seed does not build: the "
                                  "comparison is impossible", logs=logs, provenance=prov)
            seed_so = sb.so_path
        return self._run_gpu(req, wl, params, b.so_path, seed_so, prov, logs, notes, progress)

    def _detect(self) -> list[dict[str, str]]:
        if self._gpus is None:
            self._gpus = detect_gpu()
        return self._gpus

    def _helpers_so(self) -> Path:
        if self._helpers is None:
            self._helpers = build_helpers(self.cfg.cache_dir, self.cfg.build)
        return self._helpers

    def _mps_state(self, world: int) -> MpsState:
        if not self.cfg.use_mps:
            return MpsState(False, False, note="MPS disabled by config")
        if self._mps is None:
            self._mps = MpsDaemon(self.root / "mps")
        return self._mps.ensure()

    def _group_spec(self, req: EvalRequest, params: dict[str, int], scratch: Path) -> GroupSpec:
        bcfg = self.cfg.build or BuildConfig()
        header = nccl_header_version(bcfg.nccl_include) if bcfg.nccl_include else None
        config = {"workload_dir": str(Path(req.workload_dir).resolve()), "params": params,
                  "backend": req.backend, "helpers_so": str(self._helpers_so()), "flag_words": self.cfg.flag_words,
                  "flush_bytes": self.cfg.flush_bytes, "nccl_header_version": header,
                  "load_dir": str(scratch / "so"), "device": 0}
        (scratch / "so").mkdir(parents=True, exist_ok=True)
        extra: dict[str, str] = {"CUCO_STORE_TIMEOUT_S": "300"}
        per_rank = None
        if req.backend == "symm":
            extra["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
            st = self._mps_state(req.world_size)
            per_rank = [st.rank_env(r, req.world_size, self.cfg.mps_thread_percentage)
                        for r in range(req.world_size)]
        return GroupSpec(world=req.world_size, config=config, scratch=scratch, extra_env=extra,
                         per_rank_env=per_rank, pythonpath=str(REPO_ROOT))

    def _run_gpu(self, req: EvalRequest, wl: Workload, params: dict[str, int], so: Path, seed_so: Path | None,
                 prov: dict[str, Any], logs: dict[str, str], notes: list[str], progress: Progress | None) -> EvalResult:
        key = json.dumps([str(Path(req.workload_dir).resolve()), sorted(params.items()), req.world_size,
                          req.backend])
        starts_before = self.pool.starts
        try:
            group = self.pool.group(key, lambda s: self._group_spec(req, params, s), progress)
        except WorkerError as exc:
            logs.update({k: _tail(v) for k, v in exc.logs.items()})
            self._after_fault(req, notes)
            prov["notes"] = notes
            return EvalResult("L1", "error", f"rank workers did not start: {exc}", logs=logs, provenance=prov)
        warm = self.pool.starts == starts_before
        prov["warm_workers"] = warm
        prov["worker_start_seconds"] = 0.0 if warm else round(group.started_s, 3)
        prov["rank_isolation"] = group.isolation.provenance() if group.isolation else None
        if group.info:
            i0 = group.info[0]
            prov.update({"gpu_torch": i0.get("gpu"), "torch": i0.get("torch"), "torch_cuda": i0.get("cuda"),
                         "nccl": i0.get("nccl_version"), "symm_mem_backend": i0.get("symm_mem_backend")})
        if self._mps is not None and req.backend == "symm":
            prov.update(self._mps.provenance())
        else:
            prov["mps"] = False
        base_cmd = {"op": "eval", "trials": req.trials, "warmup": req.warmup, "iters": req.iters,
                    "verify_every": req.verify_every, "seed": req.seed, "jitter_us": self.cfg.jitter_us,
                    "setup_limit_s": self.cfg.setup_limit_s}
        seed_median = None
        seed_iters: list[float] | None = None
        if seed_so is not None:
            cmd = dict(base_cmd, so_path=str(seed_so), role="seed", step_limit_s=self.cfg.seed_step_limit_s)
            sres = self._command(group, cmd, progress)
            if sres.verdict != "pass":
                logs.update(sres.logs)
                self._after_fault(req, notes) if sres.reason.startswith("timeout") else None
                prov["notes"] = notes
                return EvalResult(sres.level_reached, "error", f"the workload's seed did not pass in this world "
                                  f"({sres.reason}); nothing to compare against", logs=logs, provenance=prov)
            seed_median, seed_iters = sres.median_ms, sres.iteration_ms
            group = self.pool.group(key, lambda s: self._group_spec(req, params, s), progress)
        limit = self.cfg.seed_step_limit_s
        if seed_median is not None:
            limit = max(self.cfg.min_step_limit_s, self.cfg.step_limit_factor * seed_median / 1000.0)
        cmd = dict(base_cmd, so_path=str(so), role="candidate", step_limit_s=limit, timeline=req.timeline)
        res = self._command(group, cmd, progress)
        res.logs = {**logs, **res.logs}
        if res.reason.startswith("timeout") or "fatal" in res.provenance.get("_flags", ""):
            self._after_fault(req, notes)
        res.provenance.pop("_flags", None)
        res.provenance = {**prov, **res.provenance, "step_limit_s": round(limit, 3)}
        if seed_median is not None:
            res.seed_median_ms = seed_median
            if res.verdict == "pass" and res.median_ms:
                res.speedup = seed_median / res.median_ms
                res.flagged = res.speedup > FLAG_SPEEDUP
                res.seed_iteration_ms = seed_iters
                res.speedup_ci = speedup_ci(seed_iters, res.iteration_ms, seed=req.seed)
        if notes:
            res.provenance["notes"] = notes + res.provenance.get("notes", [])
        self.history.append({"label": req.label, "warm": prov["warm_workers"], "verdict": res.verdict})
        return res

    def _command(self, group: Any, cmd: dict[str, Any], progress: Progress | None) -> EvalResult:
        """Run one eval command in a world and merge the ranks' replies into an EvalResult."""
        timeout = self.cfg.request_timeout_s
        try:
            replies = group.request(cmd, timeout_s=timeout, progress=progress)
        except WorkerError as exc:
            return EvalResult("L2", "fail", f"timeout: {exc}" if exc.kind == "hang" else f"rank died: {exc}",
                              logs={k: _tail(v) for k, v in exc.logs.items()}, provenance={"_flags": "fatal"})
        logs = {k: _tail(v) for k, v in group.tails().items()}
        return merge_replies(replies, logs)

    def _after_fault(self, req: EvalRequest, notes: list[str]) -> None:
        if req.backend == "symm" and self._mps is not None:
            notes.append(self._mps.recover())

    def _base_provenance(self, req: EvalRequest) -> dict[str, Any]:
        gpus = self._detect()
        g0 = gpus[0] if gpus else {}
        return {"gpu": g0.get("name"), "gpus": len(gpus), "driver": g0.get("driver_version"),
                "cuda_driver": driver_cuda_version() if gpus else None, "git": git_revision(),
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "world": req.world_size, "backend": req.backend,
                "python": sys.version.split()[0]}


def merge_replies(replies: list[dict[str, Any] | None], logs: dict[str, str]) -> EvalResult:
    """All ranks' replies -> one result. A missing reply (a rank ended by the others' fatal fault) counts as a
    failure; the reason is the first rank's own (not 'a peer failed') reason."""
    flags = ""
    if any(r is None or r.get("fatal") for r in replies):
        flags = "fatal"
    failed = [r for r in replies if r is not None and r.get("verdict") != "pass"]
    if failed or any(r is None for r in replies):
        own = [r for r in failed if r.get("reason") and "peer" not in r["reason"]]
        pick = (own or failed or [{}])[0]
        verdict: Verdict = "error" if pick.get("verdict") == "error" else "fail"
        reason = pick.get("reason") or "a rank stopped replying after a peer's fatal fault"
        level: Level = pick.get("level", "L2")
        notes = [n for r in replies if r for n in r.get("notes", [])]
        errs: list[float] = [r["max_rel_err"] for r in replies if r and r.get("max_rel_err") is not None]
        return EvalResult(level, verdict, reason, max_rel_err=max(errs) if errs else None, logs=logs,
                          provenance={"notes": sorted(set(notes)), "_flags": flags})
    per_rank = [r["times_ms"] for r in replies if r is not None]
    stats = iteration_stats(per_rank)
    errs = [r["max_rel_err"] for r in replies if r and r.get("max_rel_err") is not None]
    notes = sorted({n for r in replies if r for n in r.get("notes", [])})
    rows = [row for r in replies if r for row in (r.get("timeline") or [])]
    return EvalResult("L3", "pass", "", median_ms=stats["median_ms"], spread_ms=stats["spread_ms"],
                      timeline=sorted(rows, key=lambda x: x["start_us"]) or None,
                      iteration_ms=stats["iteration_ms"], per_rank_median_ms=stats["per_rank_median_ms"],
                      max_rel_err=max(errs) if errs else None, logs=logs,
                      provenance={"notes": notes, "p10_ms": stats["p10_ms"], "p90_ms": stats["p90_ms"],
                                  "_flags": flags})
