"""GpuEvaluator: the evaluation cascade L0 (static) -> L1 (build) -> L2 (verify) -> L3 (bench) on real GPUs.

L0 and L1 run in this process (no CUDA). L2 and L3 run in warm rank workers (pool.py) that keep communicator,
windows and the flag region between candidates; the workload's seed is measured in the same world with the same
protocol, so results are ratios. This process never creates a CUDA context.

The seed is measured once per (world, seed build, request protocol) and reused (seed_cache.py says when it is
measured again and what that could hide); a ratio that claims something (a new best, a flagged one) has the seed
measured again right beside it. Timed iterations stop early once the median's interval is tight (stop rule), and
each rank keeps the torch reference's outputs per iteration (rank/reference_cache.py). Every result carries its
phases (phase_clock.py) in ``provenance["phases"]``.

At two ranks and more a candidate (and the seed) that uses the runtime's signalling primitives is built ONCE, with
the stress define (build.stress_config): its L2 trials run with the primitives pausing at random
(runtime/cuco_stress.h), then the pauses are switched off and L3 times the same loaded library, whose disabled
hooks cost one predicated-off branch per signal and wait, on the seed's side as on the candidate's. One build
and one load instead of two halves the nvcc work of a cold cache. The trials' schedule is perturbed whatever the
candidate signals with (rank/perturb.py: a late rank per trial with a start delay and an interference kernel),
and a candidate that passes at sizes too small to race runs its L2 trials once more at a larger size preset
(race_size.py). Every passing result carries both timings (device and end to end, docs/timing.md); the ratio to
the seed compares the same timing on both sides.

Safe to call from a worker thread (one evaluation at a time per evaluator; a lock serialises callers). An executor
runs several evaluators at once, one per GPU set: ``EvaluatorConfig.visible_devices`` gives each its GPUs (its
ranks' CUDA_VISIBLE_DEVICES, and its own MPS daemon's when it starts one).
"""
from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import json
import os
import shutil
import site
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate import race_size
from cuco_kit.evaluate.api import FLAG_SPEEDUP, EvalRequest, EvalResult, Level, Progress, Verdict
from cuco_kit.evaluate.build import (
    BuildConfig,
    build,
    build_helpers,
    for_workload,
    has_stress_hooks,
    nccl_header_version,
    stress_config,
)
from cuco_kit.evaluate.device import REPO_ROOT, detect_gpu, driver_cuda_version, git_revision
from cuco_kit.evaluate.mps import MpsDaemon, MpsState
from cuco_kit.evaluate.phase_clock import PhaseClock, slowest_rank
from cuco_kit.evaluate.pool import GroupSpec, PoolConfig, WorkerError, WorkerGroup, WorkerPool
from cuco_kit.evaluate.seed_cache import SeedCache
from cuco_kit.evaluate.stats import FLUSH_BYTES, iteration_stats, speedup_ci
from cuco_kit.workload import Workload, load_workload, workload_fingerprint

LEVEL_ORDER = {"L0": 0, "L1": 1, "L2": 2, "L3": 3}


def start_delay_us(floor_us: float, step_share: float, seed_step_ms: float | None) -> float:
    """J, the late rank's start delay (rank/perturb.py), for one candidate's command: ``floor_us``, or
    ``step_share`` of the seed's step when that is longer (0 stays off). A consumer that does not wait reads a late
    rank's data only after the work it does first (at two ranks a GEMM over its own rows, half a step), so the late
    rank shows the race only when it starts later than that: a fixed J of a few hundred microseconds hides every
    such race in a millisecond step."""
    if floor_us <= 0 or seed_step_ms is None or step_share <= 0:
        return max(floor_us, 0.0)
    return max(floor_us, step_share * seed_step_ms * 1000.0)


@dataclass
class EvaluatorConfig:
    """Knobs of the GPU evaluator; the defaults are the design's numbers."""

    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "cuco" / "builds")
    scratch_root: Path | None = None  # rank working dirs and logs (default: a fresh temp dir)
    recycle_every: int = 100  # eval commands per warm world before it is replaced (bounds dlopen leaks)
    flag_words: int = 65536  # candidate-visible flag words per rank (the first 4096 belong to the runtime)
    flush_bytes: int = FLUSH_BYTES
    use_mps: bool = True  # symm: run ranks under MPS (started only when no daemon answers)
    mps_thread_percentage: int | None = None  # per rank; None = round(100 / world)
    # Race amplification of the L2 trials at world > 1 (docs/timing.md says what each one catches and costs).
    jitter_us: float = 200.0  # J: the late rank starts J..2J after the device barrier, the others within J (0: off)
    jitter_step_share: float = 1.0  # ... and J is at least this share of the seed's step (start_delay_us)
    stress: bool = True  # L2 trials on the stress build (random pauses in the runtime's signalling primitives)
    stress_max_delay_us: float = 50.0  # longest pause after a signal / before a wait returns
    stress_permille: int = 500  # chance of a pause per call, in 1/1000
    interference: bool = True  # the late rank shares its SMs with a kernel holding them for a random time
    interference_max_hold_us: float = 200.0  # the longest time one interference CTA holds its SM
    race_size: bool = True  # L2 trials again at a larger preset when the request's traffic is under the threshold
    race_size_min_bytes: int = 8 << 20  # per rank and step (race_size.traffic_bytes)
    race_size_max_gpu_bytes: int = 2 << 30  # tensors of the race-check size on one GPU, every rank sharing it
    hold_timeout_s: float = 0.5  # device timing: a hold not released by then is a step that waits on its stream
    seed_step_limit_s: float = 30.0  # watchdog for the seed itself (no reference time yet)
    min_step_limit_s: float = 2.0  # watchdog: max(min_step_limit_s, step_limit_factor x seed step)
    step_limit_factor: float = 50.0
    setup_limit_s: float = 60.0
    start_timeout_s: float = 300.0
    request_timeout_s: float = 900.0
    run_l0: bool = True
    # The seed: measured again after this many evaluations in its world (1 = before every evaluation, the
    # strictest and slowest), a new measurement that moved past seed_drift from the last is reported, and a ratio
    # that claims something (a new best, flagged) gets a seed measured right after it (seed_cache.py).
    seed_every: int = 20
    seed_drift: float = 0.03
    seed_beside_claims: bool = True
    # Stop rule for a candidate's timed iterations: after stop_min_iters, stop once the median's 95% interval is
    # within stop_rel_ci of it on every rank (None: always request.iters). The seed is always timed in full.
    stop_rel_ci: float | None = 0.01
    stop_min_iters: int = 5
    reference_cache_bytes: int = 1 << 30  # per rank: the torch reference's outputs kept between candidates
    build: BuildConfig | None = None  # None = its defaults
    # The GPUs this evaluator's ranks (and MPS daemon) see, CUDA_VISIBLE_DEVICES syntax ("2,3"); None = all.
    visible_devices: str | None = None

    def pool_config(self) -> PoolConfig:
        return PoolConfig(recycle_every=self.recycle_every, start_timeout_s=self.start_timeout_s)


# ------------------------------------------------------------------------------------------------ L0 / L1

def run_l0(code: str, parent_code: str | None) -> tuple[bool | None, list[str], str]:
    """(ok, reasons, note). ok None = L0 could not run here (tree-sitter missing on the GPU image): the
    evaluation goes on and says so. Remembered per (code, parent) in this process, so a build pool that ran it
    ahead (prebuild) takes it off the GPU's path."""
    key = hashlib.sha256(f"{len(code)}:{code}\0{parent_code}".encode()).hexdigest()
    with _L0_LOCK:
        hit = _L0_SEEN.get(key)
    if hit is not None:
        return hit
    try:
        from cuco_kit.source.static_check import check_candidate
    except ModuleNotFoundError as exc:
        if "tree_sitter" in str(exc):
            return None, [], ("L0 not run: tree-sitter is not installed on this machine (pip install "
                              "tree-sitter tree-sitter-cuda); the host-code whitelist was not checked")
        raise
    rep = check_candidate(code, parent_code)
    out = (bool(rep.ok), list(rep.reasons), "")
    with _L0_LOCK:
        if len(_L0_SEEN) >= L0_REMEMBERED:
            _L0_SEEN.pop(next(iter(_L0_SEEN)))
        _L0_SEEN[key] = out
    return out


L0_REMEMBERED = 4096  # L0 verdicts kept per process (oldest first out)
_L0_SEEN: dict[str, tuple[bool | None, list[str], str]] = {}
_L0_LOCK = threading.Lock()


def build_config_for(config: EvaluatorConfig, workload_dir: str | Path, code: str, backend: str,
                     stress: bool) -> BuildConfig:
    """How ``code`` is built for an evaluation: with the stress hooks when its L2 trials run stressed
    (``stress``) and it has waits to instrument, else plainly. The same rule for candidate and seed."""
    cfg = for_workload(config.build, workload_dir)
    return stress_config(cfg) if stress and has_stress_hooks(code, backend) else cfg


def prebuild(config: EvaluatorConfig, request: EvalRequest, *, stress: bool | None = None) -> bool:
    """L1 for a request ahead of its evaluation, into ``config``'s build cache (no GPU, no evaluator needed: a
    build pool on any CPU can warm the cache): L0 first (its verdict is remembered for the evaluation), then the
    build its evaluation will load, stressed when ``stress`` (default: ``config.stress`` at two ranks and more).
    Returns whether L0 passed and the build succeeded (or was cached)."""
    if config.run_l0 and run_l0(request.candidate_code, request.parent_code)[0] is False:
        return False  # L0 rejects it: the evaluation will not build it either
    if stress is None:
        stress = config.stress and request.world_size > 1
    cfg = build_config_for(config, request.workload_dir, request.candidate_code, request.backend, stress)
    return bool(build(request.candidate_code, request.backend, cfg, config.cache_dir).ok)


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
        self.seeds = SeedCache(self.cfg.seed_every, self.cfg.seed_drift, self.cfg.seed_beside_claims)
        self._clock = PhaseClock()  # the phases of the evaluation in progress (evaluate makes a fresh one)
        atexit.register(self.close)

    # ----------------------------------------------------------------------------------------------- public
    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        with self._lock:
            t0 = time.monotonic()
            self._clock = PhaseClock()
            res = self._evaluate(request, progress)
            res.provenance.setdefault("eval_seconds", round(time.monotonic() - t0, 3))
            res.provenance["phases"] = {**self._clock.rounded(), **{f"rank.{k}": round(v, 4) for k, v in
                                                                     res.provenance.pop("_rank_phases", {}).items()}}
            return res

    def prebuild(self, request: EvalRequest) -> bool:
        """L1 for a request ahead of its evaluation (thread-safe, no GPU): the search calls this for upcoming
        candidates so nvcc runs while the GPU evaluates. Returns whether the build succeeded (or was cached)."""
        return prebuild(self.cfg, request, stress=self._wants_stress(request))

    def _wants_stress(self, request: EvalRequest) -> bool:
        """Whether the request's L2 trials run stressed (world > 1, and a GPU to run them); only a source with
        waits to instrument (the runtime's primitives; host NCCL under symm) is built with the hooks, the others
        get the harness's late-rank jitter alone."""
        return self.cfg.stress and request.world_size > 1 and bool(self._detect())

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
            with self._clock.phase("l0"):
                ok, reasons, note = run_l0(req.candidate_code, req.parent_code)
            if note:
                notes.append(note)
            if ok is False:
                return EvalResult("L0", "fail", "L0: " + "; ".join(reasons), logs={"L0": "\n".join(reasons)},
                                  provenance=prov)
            _emit(progress, level="L0", rank=None, step="static", done=1, total=1)
        # L1
        _emit(progress, level="L1", rank=None, step="build", done=0, total=1)
        stressed = self._wants_stress(req)
        plain = for_workload(self.cfg.build, wl.directory)
        bcfg = build_config_for(self.cfg, wl.directory, req.candidate_code, req.backend, stressed)
        hooked = bcfg != plain
        with self._clock.phase("build_wait"):
            b = build(req.candidate_code, req.backend, bcfg, self.cfg.cache_dir)
            if not b.ok and hooked:
                # the hooks do not build with this source: time and verify the plain build, jitter only
                logs["stress_build"] = _tail(b.log)
                notes.append("the build with the stress hooks failed (logs['stress_build']): L2 trials ran on the "
                             "plain build with the harness's late-rank jitter only")
                b, hooked = build(req.candidate_code, req.backend, plain, self.cfg.cache_dir), False
        logs["build"] = _tail(b.log)
        prov["build_seconds"] = round(b.seconds, 3)
        prov["build_cached"] = b.cached
        if not b.ok or b.so_path is None:
            return EvalResult("L1", "fail", "L1: build failed (see logs['build'])", logs=logs, provenance=prov)
        stress_so = b.so_path if stressed else None  # without hooks: the harness's stress only
        prov["l2_stress"] = stress_so is not None
        if hooked:
            prov["stress_build_seconds"] = round(b.seconds, 3)
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
        if req.measure_seed or wl.oracle == "seed":  # a seed-oracle workload's seed runs whatever the request says
            seed_code = wl.seed_for(req.backend).read_text()
            with self._clock.phase("seed_build"):
                sb = build(seed_code, req.backend, build_config_for(self.cfg, wl.directory, seed_code, req.backend,
                                                                    stressed), self.cfg.cache_dir)
            if not sb.ok:
                logs["seed_build"] = _tail(sb.log)
                return EvalResult("L1", "error", f"the workload's {req.backend} seed does not build: the "
                                  "comparison is impossible", logs=logs, provenance=prov)
            seed_so = sb.so_path
        return self._run_gpu(req, wl, params, b.so_path, seed_so, stress_so, prov, logs, notes, progress)

    def _detect(self) -> list[dict[str, str]]:
        """The GPUs this evaluator may use: nvidia-smi's list, narrowed to ``visible_devices`` when set."""
        if self._gpus is None:
            gpus = detect_gpu()
            vis = self.cfg.visible_devices
            if vis is not None:
                wanted = [v.strip() for v in vis.split(",") if v.strip()]
                gpus = [g for w in wanted for g in gpus if w in (g.get("index"), g.get("uuid"))]
            self._gpus = gpus
        return self._gpus

    def _cuda_visible(self) -> str | None:
        """CUDA_VISIBLE_DEVICES for the ranks and the MPS daemon: the set's GPU UUIDs, which mean the same in a
        client of an MPS server started on that set (indices would be renumbered by the server)."""
        if self.cfg.visible_devices is None:
            return None
        uuids = [g["uuid"] for g in self._detect() if g.get("uuid")]
        return ",".join(uuids) or self.cfg.visible_devices

    def _helpers_so(self) -> Path:
        if self._helpers is None:
            self._helpers = build_helpers(self.cfg.cache_dir, self.cfg.build)
        return self._helpers

    def _mps_state(self, world: int) -> MpsState:
        if not self.cfg.use_mps:
            return MpsState(False, False, note="MPS disabled by config")
        if self._mps is None:
            self._mps = MpsDaemon(self.root / "mps", visible_devices=self._cuda_visible())
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
        visible = self._cuda_visible()
        if visible is not None:
            extra["CUDA_VISIBLE_DEVICES"] = visible
        per_rank = None
        if req.backend == "symm":
            extra["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
            st = self._mps_state(req.world_size)
            per_rank = [st.rank_env(r, req.world_size, self.cfg.mps_thread_percentage)
                        for r in range(req.world_size)]
        return GroupSpec(world=req.world_size, config=config, scratch=scratch, extra_env=extra,
                         per_rank_env=per_rank, pythonpath=str(REPO_ROOT))

    @staticmethod
    def _world_key(req: EvalRequest, params: dict[str, int]) -> str:
        """The pool's key of the world that serves ``req`` at ``params``."""
        return json.dumps([str(Path(req.workload_dir).resolve()), sorted(params.items()), req.world_size,
                           req.backend])

    def _command_at(self, req: EvalRequest, params: dict[str, int], cmd: dict[str, Any], fingerprint: str,
                    progress: Progress | None) -> EvalResult:
        """``cmd`` in the (warm) world of ``req`` at ``params``: the race-check size's world."""
        try:
            group = self.pool.group(self._world_key(req, params), lambda s: self._group_spec(req, params, s),
                                    progress, fingerprint=fingerprint)
        except WorkerError as exc:
            return EvalResult("L1", "error", f"rank workers did not start: {exc}",
                              logs={k: _tail(v) for k, v in exc.logs.items()}, provenance={"_flags": "fatal"})
        return self._command(group, cmd, progress)

    def _run_gpu(self, req: EvalRequest, wl: Workload, params: dict[str, int], so: Path, seed_so: Path | None,
                 stress_so: Path | None, prov: dict[str, Any], logs: dict[str, str], notes: list[str],
                 progress: Progress | None) -> EvalResult:
        key = self._world_key(req, params)
        fingerprint = workload_fingerprint(wl.directory)
        starts_before = self.pool.starts
        try:
            group = self.pool.group(key, lambda s: self._group_spec(req, params, s), progress,
                                    fingerprint=fingerprint)
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
                    "interference": ({"max_hold_ns": int(self.cfg.interference_max_hold_us * 1000)}
                                     if self.cfg.interference else None),
                    "setup_limit_s": self.cfg.setup_limit_s, "hold_timeout_s": self.cfg.hold_timeout_s,
                    # the seed's verified outputs are the candidate's oracle only for the same seed build, inputs
                    # and iterations
                    "oracle": wl.oracle, "oracle_key": f"{seed_so}:{req.seed}:{req.trials}:{req.iters}:"
                                                       f"{req.verify_every}"}
        group_for = partial(self.pool.group, key, lambda s: self._group_spec(req, params, s), progress,
                            fingerprint=fingerprint)
        seed_res: EvalResult | None = None
        seed_key = json.dumps([key, str(seed_so), base_cmd["oracle_key"], req.warmup])
        seed_cmd = dict(base_cmd, so_path=str(seed_so), role="seed", step_limit_s=self.cfg.seed_step_limit_s)
        if seed_so is not None:
            entry = self.seeds.reusable(seed_key, group)
            if entry is not None:
                seed_res = entry.result
                prov["seed_measured"] = f"reused ({entry.served - 1} evaluations after its measurement in this world)"
            else:
                seed_res, group, failure = self._measure_seed(req, wl, group, group_for, seed_cmd, seed_key, logs,
                                                              notes, progress)
                if failure is not None:
                    prov["notes"] = notes
                    failure.provenance = {**prov, **failure.provenance}
                    return failure
                prov["seed_measured"] = "now, before the candidate"
        limit = self.cfg.seed_step_limit_s
        if seed_res is not None and seed_res.median_ms is not None:
            limit = max(self.cfg.min_step_limit_s, self.cfg.step_limit_factor * seed_res.median_ms / 1000.0)
        jitter_us = start_delay_us(self.cfg.jitter_us, self.cfg.jitter_step_share,
                                   seed_res.median_ms if seed_res is not None else None)
        prov["late_start_us"] = round(jitter_us, 1)
        cmd = dict(base_cmd, so_path=str(so), role="candidate", step_limit_s=limit, timeline=req.timeline,
                   timeline_iters=req.timeline_iters, jitter_us=jitter_us)
        if self.cfg.stop_rel_ci is not None:
            cmd["stop"] = {"min_iters": self.cfg.stop_min_iters, "rel_ci": self.cfg.stop_rel_ci}
        if stress_so is not None:
            cmd["stress"] = {"so_path": str(stress_so), "max_delay_ns": int(self.cfg.stress_max_delay_us * 1000),
                             "permille": int(self.cfg.stress_permille)}
        with self._clock.phase("candidate"):
            res = self._command(group, cmd, progress)
        if self.cfg.race_size and res.verdict == "pass":
            with self._clock.phase("race_size"):
                res = race_size.check(res, wl, params, req.world_size, req.backend, cmd=cmd,
                                      seed_cmd=(dict(base_cmd, so_path=str(seed_so), role="seed")
                                                if wl.oracle == "seed" and seed_so is not None else None),
                                      min_bytes=self.cfg.race_size_min_bytes,
                                      max_gpu_bytes=self.cfg.race_size_max_gpu_bytes,
                                      step_limit_s=self.cfg.seed_step_limit_s,
                                      run=lambda p, c: self._command_at(req, p, c, fingerprint, progress))
        if res.level_reached in ("L2", "L3") and not res.reason.startswith("rank died"):
            res.oracle = wl.oracle
        res.logs = {**logs, **res.logs}
        if res.reason.startswith("timeout") or "fatal" in res.provenance.get("_flags", ""):
            self._after_fault(req, notes)
        res.provenance.pop("_flags", None)
        res.provenance = {**prov, **res.provenance, "step_limit_s": round(limit, 3)}
        if seed_res is not None:
            score_against(res, seed_res, req.seed)
            if (res.verdict == "pass" and prov["seed_measured"].startswith("reused")
                    and self.seeds.claims(seed_key, res)):
                # a claim rests on a seed measured right beside it, in the same world
                fresh, _, failure = self._measure_seed(req, wl, group, None, seed_cmd, seed_key, logs, notes,
                                                       progress)
                if failure is None and fresh is not None:
                    score_against(res, fresh, req.seed)
                    res.provenance["seed_measured"] = ("again, right after the candidate (its ratio claimed a new "
                                                       "best or was flagged)")
                else:
                    notes.append("the seed could not be measured again beside this claimed ratio; the ratio uses "
                                 "its previous measurement")
            self.seeds.scored(seed_key, res)
        if notes:
            res.provenance["notes"] = notes + res.provenance.get("notes", [])
        self.history.append({"label": req.label, "warm": prov["warm_workers"], "verdict": res.verdict})
        return res

    def _measure_seed(self, req: EvalRequest, wl: Workload, group: Any, group_for: Any, seed_cmd: dict[str, Any],
                      seed_key: str, logs: dict[str, str], notes: list[str],
                      progress: Progress | None) -> tuple[EvalResult | None, Any, EvalResult | None]:
        """Measure the seed in ``group`` and record it; returns (seed result, the group to go on with, a failure
        result or None). ``group_for`` (None: stay in ``group``) fetches the world again afterwards: it may have
        recycled itself, and with it a seed oracle's recorded outputs, so the seed then runs once more."""
        with self._clock.phase("seed"):
            sres = self._command(group, seed_cmd, progress)
        if sres.verdict != "pass":
            logs.update(sres.logs)
            if sres.reason.startswith("timeout"):
                self._after_fault(req, notes)
            what = "the oracle" if wl.oracle == "seed" else "nothing to compare against"
            return None, group, EvalResult(sres.level_reached, "error", f"the workload's seed did not pass in this "
                                           f"world ({sres.reason}); {what}", logs=logs)
        if group_for is not None:
            starts = self.pool.starts
            group = group_for()
            if self.pool.starts != starts:
                # the world restarted after the seed (it recycled itself): its recorded outputs went with it
                notes.append("the world restarted after the seed ran; the seed ran again in the new world")
                with self._clock.phase("seed"):
                    sres = self._command(group, seed_cmd, progress)
                if sres.verdict != "pass":
                    return None, group, EvalResult(sres.level_reached, "error", f"the workload's seed did not pass "
                                                   f"when run again ({sres.reason})", logs={**logs, **sres.logs})
                group = group_for()
        drift = self.seeds.store(seed_key, group, sres)
        if drift:
            notes.append(drift)
        return sres, group, None

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
        """After a timeout or a fatal reply: check the MPS server and, where a symm world's ranks were killed,
        replace every other symm world too (the race-check size's among them). Their contexts share the server
        with the killed one and can be left broken by it (a later command then fails with a CUDA error that is
        not the candidate's); a wait that ended in a verdict killed nothing and keeps its worlds warm."""
        if req.backend != "symm" or self._mps is None:
            return
        notes.append(self._mps.recover())
        groups = self.pool.groups
        killed = [k for k, g in groups.items() if _backend_of(k) == "symm" and (g.broken or not g.alive())]
        beside = [k for k in groups if _backend_of(k) == "symm" and k not in killed]
        if killed and beside:
            for key in beside:
                self.pool.discard(key, reason="a symm world beside it under the same MPS server was killed")
            notes.append(f"replaced {len(beside)} other warm symm world(s) under the same MPS server: a killed "
                         "world can leave their CUDA contexts broken")

    def _base_provenance(self, req: EvalRequest) -> dict[str, Any]:
        gpus = self._detect()
        g0 = gpus[0] if gpus else {}
        return {"gpu": g0.get("name"), "gpus": len(gpus), "driver": g0.get("driver_version"),
                "cuda_driver": driver_cuda_version() if gpus else None, "git": git_revision(),
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "world": req.world_size, "backend": req.backend,
                "cuda_visible_devices": self.cfg.visible_devices, "python": sys.version.split()[0]}


def _backend_of(world_key: str) -> str:
    """The backend a pool key of GpuEvaluator._world_key names (its last field)."""
    return str(json.loads(world_key)[-1])


# How a rank's reason says it stopped because another rank failed (rank/harness.py): "a peer failed in ...",
# "verification failed on a peer in ...". Other reasons may name a peer ("user flag (peer 0, slot 3)", "a missing
# wait on a peer") and are still the rank's own.
PEER_FAILED = ("a peer failed", "failed on a peer")


def merge_replies(replies: list[dict[str, Any] | None], logs: dict[str, str]) -> EvalResult:
    """All ranks' replies -> one result. A missing reply (a rank ended by the others' fatal fault) counts as a
    failure; the reason is the first rank's own (not 'a peer failed') reason."""
    flags = ""
    if any(r is None or r.get("fatal") for r in replies):
        flags = "fatal"
    failed = [r for r in replies if r is not None and r.get("verdict") != "pass"]
    if failed or any(r is None for r in replies):
        own = [r for r in failed if r.get("reason") and not any(p in r["reason"] for p in PEER_FAILED)]
        pick = (own or failed or [{}])[0]
        verdict: Verdict = "error" if pick.get("verdict") == "error" else "fail"
        reason = pick.get("reason") or "a rank stopped replying after a peer's fatal fault"
        level: Level = pick.get("level", "L2")
        notes = [n for r in replies if r for n in r.get("notes", [])]
        errs: list[float] = [r["max_rel_err"] for r in replies if r and r.get("max_rel_err") is not None]
        return EvalResult(level, verdict, reason, max_rel_err=max(errs) if errs else None, logs=logs,
                          provenance={"notes": sorted(set(notes)), "_flags": flags,
                                      "_rank_phases": slowest_rank([r.get("phases") for r in replies if r])})
    ok = [r for r in replies if r is not None]
    stats = iteration_stats([r["times_ms"] for r in ok])
    errs = [r["max_rel_err"] for r in ok if r.get("max_rel_err") is not None]
    notes = sorted({n for r in ok for n in r.get("notes", [])})
    rows = [row for r in ok for row in (r.get("timeline") or [])]
    prov: dict[str, Any] = {"notes": notes, "p10_ms": stats["p10_ms"], "p90_ms": stats["p90_ms"], "_flags": flags,
                            "_rank_phases": slowest_rank([r.get("phases") for r in ok])}
    l2 = [r["l2_seconds"] for r in ok if r.get("l2_seconds") is not None]
    if l2:
        prov["l2_seconds"] = max(l2)
    return EvalResult("L3", "pass", "", median_ms=stats["median_ms"], spread_ms=stats["spread_ms"],
                      timeline=sorted(rows, key=lambda x: x["start_us"]) or None,
                      iteration_ms=stats["iteration_ms"], per_rank_median_ms=stats["per_rank_median_ms"],
                      max_rel_err=max(errs) if errs else None, timing=merge_timings(ok), logs=logs,
                      provenance=prov)


def _timing_block(per_rank: list[list[float]]) -> dict[str, Any]:
    st = iteration_stats(per_rank)
    return {k: st[k] for k in ("median_ms", "spread_ms", "iteration_ms", "per_rank_median_ms", "p10_ms", "p90_ms")}


def merge_timings(replies: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Both timings of passing replies (``device_ms`` and ``e2e_ms`` per rank, combined slowest rank first as the
    score is), and which one scored; None for replies that carry neither."""
    if not replies or "e2e_ms" not in replies[0]:
        return None
    device = [r.get("device_ms") for r in replies]
    out: dict[str, Any] = {"score": replies[0].get("timing", "end_to_end"),
                           "device": _timing_block(device) if all(device) else None,  # type: ignore[arg-type]
                           "end_to_end": _timing_block([r["e2e_ms"] for r in replies])}
    if out["device"] is None:
        out["note"] = NO_DEVICE_TIME
    return out


NO_DEVICE_TIME = "no device time: the step waits on its own stream inside cuco_step; scored end to end"


def seed_iterations(res: EvalResult, seed: EvalResult) -> list[float] | None:
    """The seed's timed iterations in the timing that scored the candidate (after compare_timings)."""
    block = seed.timing.get(res.timing["score"]) if res.timing is not None and seed.timing is not None else None
    return block["iteration_ms"] if block else seed.iteration_ms


def score_against(res: EvalResult, seed: EvalResult, request_seed: int) -> None:
    """The candidate's ratio to ``seed`` and its interval, in the same timing on both sides (no-op but for the
    seed's median unless the candidate passed)."""
    res.seed_median_ms = seed.median_ms
    if res.verdict != "pass":
        return
    compare_timings(res, seed)
    if res.median_ms and res.seed_median_ms:
        res.speedup = res.seed_median_ms / res.median_ms
        res.flagged = res.speedup > FLAG_SPEEDUP
        res.seed_iteration_ms = seed_iterations(res, seed)
        res.speedup_ci = speedup_ci(res.seed_iteration_ms, res.iteration_ms, seed=request_seed)


def compare_timings(res: EvalResult, seed: EvalResult) -> None:
    """Make the candidate's score and the seed's time the same timing: when either side has no device time,
    both are compared end to end (the candidate's median_ms then becomes its end-to-end median, and a note says
    why). Sets res.seed_median_ms; the caller computes the ratio."""
    if res.timing is None or seed.timing is None:
        return
    kind = res.timing["score"]
    if seed.timing.get(kind) is None:
        kind = "end_to_end"
        res.timing["note"] = ("the seed's step waits on its own stream (no device time): candidate and seed are "
                              "compared end to end")
    if kind != res.timing["score"]:
        block = res.timing[kind]
        res.timing["score"] = kind
        res.median_ms, res.spread_ms, res.iteration_ms = block["median_ms"], block["spread_ms"], block["iteration_ms"]
        res.per_rank_median_ms = block["per_rank_median_ms"]
        res.provenance.update(p10_ms=block["p10_ms"], p90_ms=block["p90_ms"])
    res.seed_median_ms = seed.timing[kind]["median_ms"]
