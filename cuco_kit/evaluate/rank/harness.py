"""The timing and verification protocol inside one rank: the body of a rank worker (worker.py).

Per timed iteration, on every rank (docs/architecture.md has the path around it):
  fresh inputs (seeded per (trial, rank), never zeros) -> poison outputs (all-ones bytes: NaN in every float
  dtype) -> flush L2 (write a 256 MB buffer) -> host barrier (gloo) -> device barrier kernel -> start event ->
  cuco_step -> end event -> synchronise -> host barrier.
Two timings per timed iteration (docs/timing.md): DEVICE time, with the stream held by a blocking kernel while the
host enqueues the whole iteration and released after the end event (nvbench's method: the events see the device
work with the launches already queued), and END-TO-END time, the same iteration without the hold (host launches
included). The workload's ``timing`` says which one scores. A step that waits on its own stream inside cuco_step
stalls behind the hold until the hold's timeout: after two such stalls the candidate is timed end to end only,
and the reply says so.
Verified iterations (every L2 trial, the first timed iteration and about 1 in verify_every timed ones, chosen
from the request seed) also: snapshot the outputs on ctx->stream right after the end event (what the step
delivered by the time ctx->stream says it is done), and after every rank has finished compare the snapshot with
the outputs again (a difference means work that was not joined to ctx->stream, or a missing wait on a peer)
and with the oracle: the workload's torch reference, computed on this GPU in float32 from every rank's inputs
regenerated from the seeds, or, for a workload whose oracle is its seed (differential verification), the seed's
own outputs of the same iteration, recorded when the seed ran in this world just before (same request seed, so
the same inputs). NaN never passes. At two ranks and more the L2 trials perturb the schedule (rank/perturb.py):
each trial has a late rank (each rank in turn) that starts past everyone else's random start delay, pauses inside
the runtime's primitives when a stress build (runtime/cuco_stress.h) is given (after the trials its pauses are
switched off and the same library is timed; a command may still name a separate stress library), and shares
its SMs with an interference kernel that holds them for a random time, so the candidate's CTAs there start late
and at different times whatever it signals with.
Host NCCL under symm: a library that exports cuco_host_nccl_bind (a symm build of a source that includes <nccl.h>,
runtime/symm_nccl/nccl.h) gets a staging window (one per worker, zeroed at every load) and is bound to it before
cuco_setup; its communicator becomes ctx->nccl_comm.
Bounded waits: a library that exports cuco_waits_bind (every build on the runtime's flags, LSA barrier or host NCCL,
runtime/cuco_waits.h) has its waits bound to the harness's control block, with the step limit as their limit. When
the watchdog fires the harness raises the block's abort word first: a step stuck in those waits ends, and the
candidate fails with a verdict naming the word it waited on (rank/waits.py), in the same world. A step still
running after that (a spin of its own) is a hang: the process ends.

The ranks agree after every iteration (a gloo all-reduce of a failure flag is the host barrier), so when one
rank fails all stop together instead of waiting for each other.
"""
from __future__ import annotations

import _ctypes
import ctypes
import math
import os
import shutil
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore
from torch.profiler import ProfilerActivity, profile

from cuco_kit.evaluate.phase_clock import PhaseClock
from cuco_kit.evaluate.rank import abi, perturb, waits
from cuco_kit.evaluate.rank.backends import Backend, NcclBackend, SymmBackend
from cuco_kit.evaluate.rank.reference_cache import ReferenceCache
from cuco_kit.evaluate.stats import FLUSH_BYTES, input_seed, median_ci_halfwidth, verified_iterations
from cuco_kit.workload import DTYPES, load_workload

HARNESS_WORDS = 64  # the harness barrier's words, after the candidate's flag words (one per rank)
# Host NCCL under symm (runtime/host_nccl_compat.h): each rank's staging window; its first 4 KiB are flag words,
# the rest is split between collective chunks and one point-to-point slot per peer
HOST_NCCL_STAGING_BYTES = 32 << 20
# After the watchdog raised the waits' abort word: how long a step stuck in the runtime's waits gets to end
WAIT_ABORT_GRACE_S = 2.0
CUDA_ERROR_CAPTURE_UNJOINED = 904
CUDA_CAPTURE_ERRORS = range(900, 909)  # cudaErrorStreamCaptureUnsupported .. cudaErrorStreamCaptureWrongThread
NO_HOLD_NOTE = ("device timing unavailable: cuco_step waits on the held stream (e.g. cudaStreamSynchronize or a "
                "blocking copy inside the step), so the hold timed out; scored by end-to-end time (host included)")

TORCH_DTYPES = {"u8": torch.uint8, "i32": torch.int32, "i64": torch.int64, "f16": torch.float16,
                "bf16": torch.bfloat16, "f32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn}


# ------------------------------------------------------------------------------------------ verification

def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| over the first ref.numel() elements of out (uneven outputs: the valid prefix),
    in float32; inf when out has any NaN/inf or is shorter than the reference."""
    o = out.reshape(-1)
    r = ref.reshape(-1).to(device=o.device)
    if o.numel() < r.numel():
        return math.inf
    o = o[: r.numel()].float()
    r = r.float()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    num = float(torch.linalg.vector_norm(o - r))
    den = float(torch.linalg.vector_norm(r))
    return num / den if den > 0 else num


# ------------------------------------------------------------------------------------------ helpers library

class Helpers:
    """ctypes view of libcuco_harness.so (runtime/harness_helpers.cu)."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        vp, u64, i = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
        specs = {
            "cuco_h_barrier": [vp, ctypes.c_size_t, i, i, u64, u64, vp, vp],
            "cuco_h_spin": [u64, vp],
            "cuco_h_interfere": [vp, u64, i, u64, u64],
            "cuco_h_hold": [vp, u64, u64, vp, vp],
            "cuco_h_release": [vp, u64],
            "cuco_h_fill_peer_table": [vp, vp, i, vp],
            "cuco_h_capture": [vp, vp, vp, i, ctypes.POINTER(ctypes.c_int)],
            "cuco_h_capture_status": [vp, ctypes.POINTER(ctypes.c_int)],
        }
        for name, args in specs.items():
            fn = getattr(self.lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int
        self.lib.cuco_h_error_name.argtypes = [ctypes.c_int]
        self.lib.cuco_h_error_name.restype = ctypes.c_char_p

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)

    def error_name(self, code: int) -> str:
        raw = self.lib.cuco_h_error_name(int(code))
        return f"{raw.decode() if raw else 'cudaError'}({code})"


class OracleMissing(Exception):
    """A candidate of a seed-oracle workload arrived in a world that holds no outputs of its request's seed."""


class CandidateFailure(Exception):
    """This candidate failed (verdict fail at `level`); ``fatal`` = the process must not serve another one."""

    def __init__(self, level: str, reason: str, fatal: bool = False) -> None:
        super().__init__(reason)
        self.level, self.reason, self.fatal = level, reason, fatal


def _is_fatal_cuda(exc: BaseException) -> bool:
    text = str(exc)
    return any(s in text for s in ("CUDA error", "cudaError", "illegal memory access", "an illegal instruction",
                                   "unspecified launch failure", "CUBLAS_STATUS", "device-side assert"))


# ------------------------------------------------------------------------------------------------ the body

class RankHarness:
    """Made once per worker process: device, gloo group, backend (communicator + windows), flag region,
    cuBLAS handle, harness stream, L2 flush buffer. ``handle({"op": "eval", ...})`` measures one candidate."""

    def __init__(self, rank: int, world: int, config: dict[str, Any], chan: Any) -> None:
        self.rank, self.world, self.cfg, self.chan = rank, world, config, chan
        self.backend_name = config.get("backend", "nccl")
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self.device = local_rank if self.backend_name == "nccl" else int(config.get("device", 0))
        torch.cuda.set_device(self.device)
        self.dev = torch.device(f"cuda:{self.device}")
        self.workload = load_workload(config["workload_dir"])
        self.params = self.workload.resolve(config.get("params") or {})
        self.flag_words = int(config.get("flag_words", 65536))
        self.scratch_dir = Path(os.getcwd())
        # gloo over the parent's store: host barriers/agreement on the hot path and the symm rendezvous
        dist.init_process_group("gloo", store=PrefixStore("gloo", chan.store), rank=rank, world_size=world)
        self.dist = dist
        self.stream = torch.cuda.Stream(device=self.dev)
        self.helpers = Helpers(config["helpers_so"])
        self.backend: Backend
        if self.backend_name == "nccl":
            self.backend = NcclBackend(rank, world, self.device, chan, self.helpers, self.stream,
                                       init_timeout_s=float(config.get("init_timeout_s", 120)),
                                       header_version=config.get("nccl_header_version"))
        elif self.backend_name == "symm":
            self.backend = SymmBackend(rank, world, self.device, chan, dist.group.WORLD)
        else:
            raise ValueError(f"unknown backend {self.backend_name!r}")
        # windows for every workload tensor, in workload order, then the flag region
        self.windows = {}
        for spec in self.workload.tensors:
            self.windows[spec.name] = self.backend.alloc_window(spec.name,
                                                                spec.capacity_bytes(self.params, world))
        self.flags = self.backend.alloc_window("flags", (self.flag_words + HARNESS_WORDS) * 8)
        self.flags.tensor.zero_()
        self.scratch_pool: list[Any] = []
        self.host_nccl_staging: Any = None  # made at the first load of a host-NCCL symm build, then reused
        # cuBLAS: one warm matmul loads libcublas and makes torch's handle for this device
        a = torch.randn(64, 64, device=self.dev)
        torch.matmul(a, a)
        self.cublas = int(torch.cuda.current_blas_handle())
        self.flush = torch.empty(int(config.get("flush_bytes", FLUSH_BYTES)), dtype=torch.uint8, device=self.dev)
        self.timed_out = torch.zeros(4, dtype=torch.int32).pin_memory()  # [0] device barrier, [1] the hold
        self.hold_word = torch.zeros(1, dtype=torch.int64).pin_memory()  # the hold's release value (host-mapped)
        # the runtime's bounded waits: their control block (host-mapped), bound at every load (rank/waits.py)
        self.wait_ctl_mem = torch.zeros(ctypes.sizeof(abi.CucoWaitCtl), dtype=torch.uint8).pin_memory()
        self.wait_ctl = abi.CucoWaitCtl.from_address(self.wait_ctl_mem.data_ptr())
        self.hold_epoch = 0
        self.unholdable: set[str] = set()  # libraries whose step stalled behind the hold: timed end to end only
        self.harness_epoch = 0
        # Differential verification: the seed's verified outputs per trial, from the seed's run that the key names
        # (so a candidate is never compared with another request's seed or inputs).
        self.oracle_key = ""
        self.oracle_outputs: dict[int, dict[str, torch.Tensor]] = {}
        # The torch reference per (request seed, iteration): the same for every candidate this world serves
        self.references = ReferenceCache(int(config.get("reference_cache_bytes", 1 << 30)))
        self.sm_count = torch.cuda.get_device_properties(self.dev).multi_processor_count
        torch.cuda.synchronize(self.dev)
        self._host_agree(False)

    def info(self) -> dict[str, Any]:
        props = torch.cuda.get_device_properties(self.dev)
        out = {"rank": self.rank, "device": self.device, "gpu": props.name, "sm_count": props.multi_processor_count,
               "torch": torch.__version__, "cuda": torch.version.cuda, "pid": os.getpid(),
               "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
               "mps_thread_percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
        out.update(self.backend.info())
        return out

    def close(self) -> None:
        torch.cuda.synchronize(self.dev)
        for w in self.scratch_pool:
            self.backend.free_window(w)
        self.scratch_pool.clear()
        if self.host_nccl_staging is not None:
            self.backend.free_window(self.host_nccl_staging)
            self.host_nccl_staging = None
        self.backend.close()
        self.dist.destroy_process_group()

    # ---------------------------------------------------------------------------------------- collectives
    def _host_agree(self, failed: bool) -> bool:
        """Host barrier that also tells whether any rank failed (gloo all-reduce of a flag)."""
        return self._host_max(1 if failed else 0) > 0

    def _host_max(self, code: int) -> int:
        """Host barrier that returns the largest of every rank's code."""
        t = torch.tensor([int(code)], dtype=torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return int(t.item())

    def _progress(self, level: str, step: str, done: int, total: int, limit_s: float) -> None:
        self.chan.progress({"level": level, "step": step, "done": done, "total": total}, limit_s=limit_s)

    # -------------------------------------------------------------------------------------------- command
    def handle(self, cmd: dict[str, Any], index: int) -> dict[str, Any]:
        op = cmd.get("op")
        if op == "ping":
            return {"ok": True}
        if op != "eval":
            return {"ok": False, "verdict": "error", "reason": f"unknown op {op!r}"}
        return _Evaluation(self, cmd).run()


class _Evaluation:
    """One candidate on one rank: [stress build: load, set up, L2 trials, teardown], load, set up, capture check,
    L2 trials (without a stress build), L3 timing, teardown."""

    def __init__(self, h: RankHarness, cmd: dict[str, Any]) -> None:
        self.h = h
        self.cmd = cmd
        self.seed = int(cmd.get("seed", 0))
        self.step_limit_s = float(cmd.get("step_limit_s", 10.0))
        self.setup_limit_s = float(cmd.get("setup_limit_s", 60.0))
        self.hold_timeout_s = float(cmd.get("hold_timeout_s", 0.5))
        self.notes: list[str] = []
        self.lib: Any = None
        self.ctx = abi.new_ctx()
        self.loaded_copy: Path | None = None
        self.live = False  # cuco_setup succeeded and cuco_teardown is still due
        self.waits_bound = False  # the loaded library's waits give up on the harness's limit and abort word
        self.waits_aborted = False  # the watchdog raised the abort word (the step then fails, ended or not)
        self.recycle = False  # a non-fatal event after which this process should not serve more candidates
        self.max_err = 0.0
        self.stalls = 0  # held iterations whose hold timed out
        self.holdable = str(cmd["so_path"]) not in h.unholdable
        self.role = str(cmd.get("role", "candidate"))
        self.oracle = str(cmd.get("oracle", "reference"))
        self.clock = PhaseClock()

    # ---------------------------------------------------------------------------------------------- main
    def run(self) -> dict[str, Any]:
        h = self.h
        reply: dict[str, Any] = {"ok": False, "rank": h.rank, "role": self.role, "oracle": self.oracle}
        self._before = set(os.listdir(h.scratch_dir))
        stress: dict[str, Any] | None = self.cmd.get("stress") or None
        try:
            self._oracle_ready()
            t0 = time.monotonic()
            stress_so = str(stress["so_path"]) if stress else ""
            separate = bool(stress_so) and stress_so != str(self.cmd["so_path"])
            clock = self.clock
            if separate:  # the stress build's own phase: L2 trials only
                with clock.phase("stress_load_setup"):
                    self._load(Path(stress_so))
                    self._setup()
                with clock.phase("stress_trials"):
                    self._verify_trials(stress)
                with clock.phase("teardown"):
                    self._teardown(reply)
                    self._unload()
            with clock.phase("load_setup"):
                self._load(Path(self.cmd["so_path"]))
                self._setup()
            with clock.phase("capture"):
                self._capture_check()
            if not separate:
                with clock.phase("stress_trials" if stress else "verify_trials"):
                    self._verify_trials(stress)
            reply["l2_seconds"] = round(time.monotonic() - t0, 4)
            reply.update(ok=True, verdict="pass", level="L3", **self._timed())
            if self.cmd.get("timeline"):
                with clock.phase("timeline"):
                    reply["timeline"] = self._profiled_iterations(max(1, int(self.cmd.get("timeline_iters", 1))))
        except CandidateFailure as f:
            reply.update(verdict="fail", level=f.level, reason=f.reason, fatal=f.fatal)
        except OracleMissing as exc:
            reply.update(verdict="error", level="L2", reason=str(exc), oracle_missing=True)
        except Exception as exc:  # noqa: BLE001 - a harness-side error is the reply; CUDA errors poison the context
            fatal = _is_fatal_cuda(exc)
            reply.update(verdict="fail" if fatal else "error", level="L2",
                         reason=f"rank {h.rank}: {type(exc).__name__}: {str(exc)[:1500]}", fatal=True)
        finally:
            with self.clock.phase("teardown"):
                if self.live and not reply.get("fatal"):
                    try:
                        self._teardown(reply)
                    except Exception as exc:  # noqa: BLE001 - a teardown error becomes a note of the reply
                        reply.update(fatal=True, notes_teardown=str(exc)[:500])
                self._unload()
        reply["phases"] = self.clock.rounded()
        reply["max_rel_err"] = self.max_err if math.isfinite(self.max_err) else None
        reply["notes"] = self.notes
        if self.recycle:
            reply["recycle"] = True
        new_files = self._new_files()
        if new_files and reply.get("verdict") == "pass":
            reply.update(ok=False, verdict="fail", level="L2",
                         reason=f"rank {h.rank} wrote files in its working directory: {', '.join(new_files[:5])}")
        return reply

    def _oracle_ready(self) -> None:
        """Differential verification: the seed's run starts a fresh record under its key; a candidate needs the
        record of the same key (the world may have restarted since the seed ran: then the parent runs it again)."""
        if self.oracle != "seed":
            return
        key = str(self.cmd.get("oracle_key", ""))
        if self.role == "seed":
            self.h.oracle_key, self.h.oracle_outputs = key, {}
        elif self.h._host_agree(not key or key != self.h.oracle_key):
            raise OracleMissing(f"rank {self.h.rank}: the seed's outputs for this request are not in this world "
                                "(the oracle must run first in the same world)")

    # ------------------------------------------------------------------------------------------ loading
    def _load(self, so: Path) -> None:
        h = self.h
        # a private copy per load: dlopen of the same path would return the old handle and its static state
        self.loaded_copy = Path(h.cfg.get("load_dir") or "/tmp") / f"cand-{os.getpid()}-{time.monotonic_ns()}.so"
        shutil.copyfile(so, self.loaded_copy)
        self.ctx = abi.new_ctx()
        problem = ""
        try:
            self.lib = ctypes.CDLL(str(self.loaded_copy), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            for sym in ("cuco_setup", "cuco_step", "cuco_teardown"):
                if not hasattr(self.lib, sym):
                    problem = f"the shared library exports no {sym} (extern \"C\" CUCO_EXPORT?)"
                    break
                fn = getattr(self.lib, sym)
                fn.argtypes = [ctypes.c_void_p]
                fn.restype = ctypes.c_int
        except OSError as exc:
            problem = f"dlopen failed: {exc}"
        if h._host_agree(bool(problem)):
            raise CandidateFailure("L2", problem or "loading the candidate failed on a peer")
        self._fill_ctx()
        self._scratch()
        self._bind_host_nccl()
        self._bind_waits()
        h.flags.tensor[: h.flag_words * 8].zero_()
        torch.cuda.synchronize(h.dev)

    def _fill_ctx(self) -> None:
        h, ctx = self.h, self.ctx
        ctx.rank, ctx.world_size = h.rank, h.world
        ctx.local_rank = int(os.environ.get("LOCAL_RANK", h.rank))
        ctx.backend = abi.BACKENDS[h.backend_name]
        ctx.device, ctx.sm_count = h.device, h.sm_count
        ctx.nccl_comm = h.backend.comm_ptr or None
        ctx.stream = h.stream.cuda_stream
        ctx.cublas = h.cublas
        params = list(h.params.items())
        if len(params) > abi.CUCO_MAX_PARAMS:
            raise CandidateFailure("L2", f"workload has {len(params)} parameters > CUCO_MAX_PARAMS")
        ctx.n_params = len(params)
        for i, (k, v) in enumerate(params):
            abi.set_name(ctx, "param_names", k, i)
            ctx.params[i] = int(v)
        specs = h.workload.tensors
        ctx.n_tensors = len(specs)
        for i, spec in enumerate(specs):
            w = h.windows[spec.name]
            t = ctx.tensors[i]
            dims = spec.dims(h.params, h.world)
            abi.set_name(t, "name", spec.name)
            t.role = abi.ROLES[spec.role]
            t.dtype = abi_dtype(spec.dtype)
            t.ndim = len(dims)
            for j, d in enumerate(dims[:4]):
                t.shape[j] = d
            self._fill_tensor(t, w, spec.capacity_bytes(h.params, h.world))
            vb = spec.valid_bytes(h.params, h.world, h.rank) if spec.valid_bytes else t.capacity_bytes
            t.valid_bytes = int(vb)
        f = ctx.flags
        f.local = h.flags.local
        f.peers = h.flags.peers.data_ptr()
        f.peers_host = ctypes.cast(h.flags.peers_host_arr, ctypes.c_void_p).value
        f.count = h.flag_words
        f.window = h.flags.window
        ctx.epoch = 0

    def _fill_tensor(self, t: abi.CucoTensor, w: Any, capacity: int) -> None:
        t.local = w.local
        t.peers = w.peers.data_ptr()
        t.peers_host = ctypes.cast(w.peers_host_arr, ctypes.c_void_p).value
        t.capacity_bytes = capacity
        t.valid_bytes = capacity
        t.window = w.window

    def _scratch(self) -> None:
        """cuco_declare_scratch (optional), checked equal on all ranks, served from the worker's pool."""
        h, ctx = self.h, self.ctx
        reqs: list[tuple[str, int]] = []
        problem = ""
        if hasattr(self.lib, "cuco_declare_scratch"):
            fn = self.lib.cuco_declare_scratch
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
            fn.restype = ctypes.c_int
            arr = (abi.CucoScratchRequest * abi.CUCO_MAX_SCRATCH)()
            n = fn(ctypes.byref(ctx), ctypes.byref(arr), abi.CUCO_MAX_SCRATCH)
            limit = int(h.cfg.get("max_scratch_bytes", 8 << 30))
            if n < 0 or n > abi.CUCO_MAX_SCRATCH:
                problem = f"cuco_declare_scratch returned {n} (allowed 0..{abi.CUCO_MAX_SCRATCH})"
            else:
                for i in range(n):
                    name = arr[i].name.decode(errors="replace")
                    size = int(arr[i].bytes)
                    if size <= 0 or size > limit:
                        problem = f"scratch {name!r}: {size} bytes (allowed 1..{limit})"
                    reqs.append((name, size))
        everyone = h.chan.all_gather("scratch", {"reqs": reqs, "problem": problem})
        bad = [f"rank {r}: {e['problem']}" for r, e in enumerate(everyone) if e["problem"]]
        if bad:
            raise CandidateFailure("L2", "; ".join(bad))
        if any(e["reqs"] != everyone[0]["reqs"] for e in everyone):
            raise CandidateFailure("L2", "cuco_declare_scratch differs across ranks (scratch windows are "
                                         "collective: declare the same list everywhere)")
        for i, (name, size) in enumerate(reqs):
            if i < len(h.scratch_pool) and h.scratch_pool[i].alloc_bytes >= size:
                w = h.scratch_pool[i]
            else:
                if i < len(h.scratch_pool):
                    h.backend.free_window(h.scratch_pool[i])
                w = h.backend.alloc_window(f"scratch{i}", size)
                if i < len(h.scratch_pool):
                    h.scratch_pool[i] = w
                else:
                    h.scratch_pool.append(w)
            w.tensor.zero_()
            t = ctx.scratch[i]
            abi.set_name(t, "name", name[: abi.CUCO_NAME_LEN - 1])
            t.role, t.dtype, t.ndim = abi.ROLES["inout"], abi_dtype("u8"), 1
            t.shape[0] = size
            self._fill_tensor(t, w, size)
        ctx.n_scratch = len(reqs)

    def _bind_host_nccl(self) -> None:
        """Host NCCL under symm: the library's cuco_host_nccl_bind (optional; only symm builds that include
        <nccl.h> have it) gets this rank's staging window, zeroed, and returns the communicator cuco_setup finds in
        ctx->nccl_comm. Every rank loaded the same library, so all of them allocate the (collective) window or
        none does."""
        h, ctx = self.h, self.ctx
        bind = getattr(self.lib, "cuco_host_nccl_bind", None) if h.backend_name == "symm" else None
        if bind is None:
            return
        if h.host_nccl_staging is None:
            h.host_nccl_staging = h.backend.alloc_window("host_nccl_staging", HOST_NCCL_STAGING_BYTES)
        w = h.host_nccl_staging
        w.tensor.zero_()  # done before any peer signals: _load synchronises, and setup starts after a host barrier
        staging = abi.CucoTensor()
        abi.set_name(staging, "name", "host_nccl_staging")
        staging.role, staging.dtype, staging.ndim = abi.ROLES["inout"], abi_dtype("u8"), 1
        staging.shape[0] = HOST_NCCL_STAGING_BYTES
        self._fill_tensor(staging, w, HOST_NCCL_STAGING_BYTES)
        bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        bind.restype = ctypes.c_int
        comm = ctypes.c_void_p(None)
        rc = int(bind(ctypes.byref(ctx), ctypes.byref(staging), ctypes.byref(comm)))
        problem = "" if rc == 0 and comm.value else (f"cuco_host_nccl_bind returned {abi.ERROR_NAMES.get(rc, rc)} "
                                                     f"(staging window of {HOST_NCCL_STAGING_BYTES} bytes, "
                                                     f"{h.world} ranks)")
        if h._host_agree(bool(problem)):
            raise CandidateFailure("L2", f"rank {h.rank}: {problem}" if problem else "cuco_host_nccl_bind failed "
                                   "on a peer")
        ctx.nccl_comm = comm.value

    def _bind_waits(self) -> None:
        """The runtime's bounded waits (runtime/cuco_waits.h; optional, every build on the runtime exports it):
        the library's waits are bound to this worker's control block, zeroed, with the step limit as their limit."""
        h = self.h
        self.waits_bound = self.waits_aborted = False
        bind = getattr(self.lib, "cuco_waits_bind", None)
        if bind is None:
            return
        waits.reset(h.wait_ctl, self.step_limit_s)
        bind.argtypes = [ctypes.c_void_p]
        bind.restype = ctypes.c_int
        rc = int(bind(ctypes.addressof(h.wait_ctl)))
        problem = "" if rc == 0 else (f"cuco_waits_bind returned {abi.ERROR_NAMES.get(rc, rc)} (a library built "
                                      f"against other runtime headers?)")
        if h._host_agree(bool(problem)):
            raise CandidateFailure("L2", f"rank {h.rank}: {problem}" if problem else "cuco_waits_bind failed on a "
                                   "peer")
        self.waits_bound = True

    def _wait_verdict(self, what: str) -> str:
        """After a step that ended: '' unless one of the runtime's waits gave up (the failure then names what it
        waited on) or the watchdog had to tell them to. The step's work is over, so this process keeps serving."""
        h, ctx = self.h, self.ctx
        if not self.waits_bound or not (h.wait_ctl.gave_up or self.waits_aborted):
            return ""
        scratch = [(ctx.scratch[i].name.decode(errors="replace"), h.scratch_pool[i], int(ctx.scratch[i].capacity_bytes))
                   for i in range(ctx.n_scratch)]
        where = waits.regions(h.flags, h.flag_words, h.windows, scratch, h.host_nccl_staging)
        found = waits.verdict(h.wait_ctl, where, what)
        if found or not self.waits_aborted:
            return found
        return (f"timeout: {what} did not finish within {self.step_limit_s:.2f} s; it ended after the runtime's waits "
                f"were told to give up")

    def _setup(self) -> None:
        h = self.h
        h._progress("L2", "setup", 0, 1, self.setup_limit_s)
        h._host_agree(False)
        rc = int(self.lib.cuco_setup(ctypes.byref(self.ctx)))
        torch.cuda.synchronize(h.dev)  # raises on a sticky fault
        failed = rc != 0
        if failed:
            h.chan.note_failure(f"cuco_setup returned {abi.ERROR_NAMES.get(rc, rc)}")
        if h._host_agree(failed):
            why = f"cuco_setup returned {abi.ERROR_NAMES.get(rc, rc)}" if failed else "cuco_setup failed on a peer"
            # setup may have made collective state on some ranks only: this world is not reused
            raise CandidateFailure("L2", f"rank {h.rank}: {why}", fatal=True)
        self.live = True

    def _teardown(self, reply: dict[str, Any]) -> None:
        h = self.h
        self.live = False
        h._progress(reply.get("level", "L2"), "teardown", 0, 1, self.setup_limit_s)
        torch.cuda.synchronize(h.dev)
        h._host_agree(False)
        rc = int(self.lib.cuco_teardown(ctypes.byref(self.ctx)))
        torch.cuda.synchronize(h.dev)
        if h._host_agree(rc != 0):
            self.notes.append(f"cuco_teardown returned {abi.ERROR_NAMES.get(rc, rc)} on rank {h.rank} or a peer")
            self.recycle = True

    def _unload(self) -> None:
        if self.lib is not None:
            try:
                _ctypes.dlclose(self.lib._handle)
            except Exception:  # noqa: BLE001 - best effort: the copy is deleted next whatever dlclose says
                pass
            self.lib = None
        if self.loaded_copy is not None:
            try:
                self.loaded_copy.unlink()
            except OSError:
                pass
            self.loaded_copy = None

    def _new_files(self) -> list[str]:
        try:
            return sorted(set(os.listdir(self.h.scratch_dir)) - self._before)
        except (OSError, AttributeError):
            return []

    # ------------------------------------------------------------------------------------------- inputs
    def _make_inputs(self, trial: int, rank: int) -> dict[str, torch.Tensor]:
        h = self.h
        g = torch.Generator(device=h.dev)
        g.manual_seed(input_seed(self.seed, trial, rank))
        specs = [s for s in h.workload.tensors if s.role in ("input", "inout")]
        if h.workload.make_inputs is not None:
            made = dict(h.workload.make_inputs(h.params, h.world, rank, g))
            out = {}
            for s in specs:
                if s.name not in made:
                    raise RuntimeError(f"workload.make_inputs gave no {s.name!r}")
                out[s.name] = made[s.name].to(device=h.dev, dtype=TORCH_DTYPES[s.dtype])
            return out
        out = {}
        for s in specs:
            shape = s.dims(h.params, h.world)
            dt = TORCH_DTYPES[s.dtype]
            if dt.is_floating_point:
                x = torch.randn(shape, generator=g, device=h.dev, dtype=torch.float32) * s.scale
                x = torch.where(x == 0, torch.full_like(x, s.scale), x)  # never exact zeros
                out[s.name] = x.to(dt)
            else:
                out[s.name] = torch.randint(1, 127, shape, generator=g, device=h.dev, dtype=torch.int64).to(dt)
        return out

    def _view(self, name: str) -> torch.Tensor:
        h = self.h
        spec = next(s for s in h.workload.tensors if s.name == name)
        n = spec.capacity_bytes(h.params, h.world)
        return h.windows[name].tensor[:n].view(TORCH_DTYPES[spec.dtype]).view(spec.dims(h.params, h.world))

    def _outputs(self) -> list[str]:
        return [s.name for s in self.h.workload.tensors if s.role in ("output", "inout")]

    def _prepare(self, trial: int) -> dict[str, torch.Tensor]:
        """Fresh inputs, poisoned outputs, flushed L2, all on the harness stream, finished before returning."""
        h = self.h
        with torch.cuda.stream(h.stream):
            inputs = self._make_inputs(trial, h.rank)
            for name, x in inputs.items():
                self._view(name).copy_(x.reshape(self._view(name).shape))
            for s in h.workload.tensors:
                if s.role == "output":
                    n = s.capacity_bytes(h.params, h.world)
                    h.windows[s.name].tensor[:n].fill_(0xFF)  # all-ones: NaN in f32/f16/bf16/fp8, -1 in ints
            h.flush.fill_(trial & 0xFF)
        h.stream.synchronize()
        return inputs

    # -------------------------------------------------------------------------------------------- a step
    def _device_barrier(self) -> None:
        h = self.h
        h.harness_epoch += 1
        rc = h.helpers.cuco_h_barrier(ctypes.c_void_p(h.flags.peers.data_ptr()), h.flag_words, h.rank, h.world,
                                      h.harness_epoch, int(max(self.step_limit_s, 2.0) * 1e9),
                                      ctypes.c_void_p(h.timed_out.data_ptr()), ctypes.c_void_p(h.stream.cuda_stream))
        if rc != 0:
            raise RuntimeError(f"device barrier launch failed: {h.helpers.error_name(rc)}")

    def _hold(self) -> None:
        """Hold the harness stream until _release (or the hold's timeout): what follows is queued, not run."""
        h = self.h
        h.hold_epoch += 1
        rc = h.helpers.cuco_h_hold(ctypes.c_void_p(h.hold_word.data_ptr()), h.hold_epoch,
                                   int(self.hold_timeout_s * 1e9),
                                   ctypes.c_void_p(h.timed_out.data_ptr() + 4), ctypes.c_void_p(h.stream.cuda_stream))
        if rc != 0:
            raise RuntimeError(f"hold launch failed: {h.helpers.error_name(rc)}")

    def _release(self) -> None:
        h = self.h
        h.helpers.cuco_h_release(ctypes.c_void_p(h.hold_word.data_ptr()), h.hold_epoch)

    def _wait_event(self, ev: torch.cuda.Event, what: str, limit_s: float) -> None:
        """Wait for an event with a watchdog. At the limit the runtime's waits are told to give up first (when the
        library's are bound): a step stuck in them ends within WAIT_ABORT_GRACE_S and _step names what it waited
        on. A step past that is a hang and ends this process."""
        deadline = time.monotonic() + limit_s
        sleep = 5e-5
        while not ev.query():
            if time.monotonic() > deadline:
                if self.waits_bound and not self.waits_aborted:
                    waits.abort(self.h.wait_ctl)
                    self.waits_aborted = True
                    deadline = time.monotonic() + WAIT_ABORT_GRACE_S
                    continue
                after = ("; it still ran after the runtime's waits were told to give up: a spin of its own"
                         if self.waits_aborted else "")
                # the note reaches the parent even when this process is killed before its verdict does
                self.h.chan.note_failure(f"{what} did not finish within {limit_s:.2f} s{after}")
                raise CandidateFailure("L2" if "trial" in what or "capture" in what else "L3",
                                       f"timeout: rank {self.h.rank}: {what} did not finish within {limit_s:.2f} s "
                                       f"(watchdog: the step hangs{after})", fatal=True)
            time.sleep(sleep)
            sleep = min(sleep * 2, 2e-3)

    def _step(self, trial: int, what: str, level: str, *, verify: bool, plan: perturb.TrialPlan | None = None,
              capture: bool = False, held: bool = False) -> tuple[float, bool]:
        """One protocol iteration; returns this rank's step time in ms and whether the hold (``held``: device
        timing) timed out on any rank, which makes the time meaningless. Raises CandidateFailure (all ranks do,
        after agreeing) when any rank failed."""
        h = self.h
        inputs = self._prepare(trial)
        if h._host_agree(False):
            raise CandidateFailure(level, "a peer failed before the step")
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        h.timed_out.zero_()
        if held:
            self._hold()
        self._device_barrier()
        if plan is not None:
            self._perturb(plan)
        start.record(h.stream)
        self.ctx.epoch += 1
        failure = ""
        try:
            if capture:
                failure = self._captured_step()
            else:
                rc = int(self.lib.cuco_step(ctypes.byref(self.ctx)))
                if rc != 0:
                    failure = f"cuco_step returned {abi.ERROR_NAMES.get(rc, rc)}"
            end.record(h.stream)
        finally:
            if held:
                self._release()  # whatever happened: a hold left in place would only end at its timeout
        snap: dict[str, torch.Tensor] = {}
        if verify:
            with torch.cuda.stream(h.stream):
                snap = {n: self._view(n).clone() for n in self._outputs()}
        if failure:
            h.chan.note_failure(failure)
        self._wait_event(end, what, self.step_limit_s)
        h.stream.synchronize()
        if int(h.timed_out[0]) != 0:
            failure = failure or (f"timeout: the device barrier waited in vain for rank "
                                  f"{int(h.timed_out[0]) - 1} (it never arrived: a hang or a crash there)")
        failure = failure or self._wait_verdict(what)
        ms = float(start.elapsed_time(end))
        worst = h._host_max(2 if failure else 1 if held and int(h.timed_out[1]) != 0 else 0)
        if worst == 2:
            raise CandidateFailure(level, f"rank {h.rank}: {failure}" if failure else "a peer failed in "
                                   f"{what}", fatal=bool(failure and "device barrier" in failure))
        if verify:
            failure = self._verify(trial, inputs, snap, what)
            if h._host_agree(bool(failure)):
                raise CandidateFailure(level, failure or f"verification failed on a peer in {what}")
        return ms, worst == 1

    def _captured_step(self) -> str:
        """The one-time stream-capture pass; returns a failure reason or ''."""
        h = self.h
        out = (ctypes.c_int * 6)()
        step_ptr = ctypes.cast(self.lib.cuco_step, ctypes.c_void_p)
        rc = h.helpers.cuco_h_capture(step_ptr, ctypes.byref(self.ctx), ctypes.c_void_p(h.stream.cuda_stream), 1, out)
        step_rc, begin, endc, inst, launch, last = list(out)
        name = h.helpers.error_name
        if rc != 0 or begin != 0:
            self.notes.append(f"stream capture check not run: cudaStreamBeginCapture -> {name(begin or rc)}")
            return self._eager_after_capture()
        if endc == CUDA_ERROR_CAPTURE_UNJOINED:
            self.recycle = True
            return ("stream capture: work forked off ctx->stream never rejoins it (cudaStreamEndCapture -> "
                    "cudaErrorStreamCaptureUnjoined); join every side stream back before cuco_step returns")
        if endc != 0:
            self.notes.append(f"stream capture check inconclusive: the step cannot be captured ({name(endc)}; "
                              f"e.g. it synchronises a stream inside cuco_step); forked work is checked by the "
                              f"output snapshots only")
            # A step that cannot be captured (a host read of device counts, as in the MoE sample) leaves the
            # stream out of capture mode and nothing sticky behind: the process keeps serving. Anything else
            # raised by then is not a capture error, and the process is replaced after this candidate.
            if last != 0 and last not in CUDA_CAPTURE_ERRORS:
                self.recycle = True
            return self._eager_after_capture()
        if step_rc != 0:
            return f"cuco_step returned {abi.ERROR_NAMES.get(step_rc, step_rc)} (under stream capture)"
        if inst != 0 or launch != 0:
            self.notes.append(f"stream capture check passed, but the graph did not instantiate/launch "
                              f"({name(inst or launch)}); ran the step eagerly instead")
            return self._eager_after_capture()
        self.notes.append("stream capture check passed: all work joined ctx->stream")
        return ""

    def _eager_after_capture(self) -> str:
        self.ctx.epoch += 1  # a fresh epoch: anything the aborted capture half-did can't satisfy a wait
        rc = int(self.lib.cuco_step(ctypes.byref(self.ctx)))
        return f"cuco_step returned {abi.ERROR_NAMES.get(rc, rc)}" if rc != 0 else ""

    def _verify(self, trial: int, inputs: dict[str, torch.Tensor], snap: dict[str, torch.Tensor], what: str) -> str:
        h = self.h
        torch.cuda.synchronize(h.dev)  # device-wide: anything the candidate left running on other streams
        h._host_agree(False)  # every rank's step (and its stores into our windows) is over
        torch.cuda.synchronize(h.dev)
        for name, s in snap.items():
            now = self._view(name)
            # bytes, not values: NaN != NaN, and an untouched poison must compare equal to itself
            if not torch.equal(now.reshape(-1).view(torch.uint8), s.reshape(-1).view(torch.uint8)):
                return (f"verification failed: rank {h.rank}: output {name!r} changed after ctx->stream "
                        f"finished the step ({what}): a missing wait on a peer, or work not joined to ctx->stream")
        if self.oracle == "seed" and self.role == "seed":
            return self._record_oracle(trial, snap, what)
        ref: Mapping[str, Any]
        if self.oracle == "seed":
            if trial not in h.oracle_outputs:  # not when seed and candidate ran one protocol; the peers fail too
                h._host_agree(True)
                raise OracleMissing(f"rank {h.rank}: the seed recorded no outputs for {what} (trial {trial})")
            ref = h.oracle_outputs[trial]
        else:
            with self.clock.phase("reference"):
                ref = self._reference(trial, inputs)
        for name, s in snap.items():
            if name not in ref:
                return f"the {self.oracle} gave no output {name!r} for rank {h.rank}"
            err = rel_error(s, ref[name].to(h.dev))
            self.max_err = max(self.max_err, err)
            if not h.workload.tolerance.passes(err):
                n_nan = int((~torch.isfinite(s.float())).sum()) if s.dtype.is_floating_point else 0
                detail = f"{n_nan} non-finite values (poison left: not written)" if n_nan else f"rel err {err:.3g}"
                return (f"verification failed: rank {h.rank}: output {name!r} wrong in {what}: {detail} "
                        f"(tolerance {h.workload.tolerance.rel:g})")
        return ""

    def _reference(self, trial: int, inputs: dict[str, torch.Tensor]) -> Mapping[str, Any]:
        """This rank's reference outputs of ``trial``: from the world's cache, else computed in float32 from every
        rank's inputs regenerated from their seeds."""
        h = self.h

        def compute() -> Mapping[str, torch.Tensor]:
            all_inputs = []
            for r in range(h.world):
                x = inputs if r == h.rank else self._make_inputs(trial, r)
                all_inputs.append({k: (v.float() if v.dtype.is_floating_point else v) for k, v in x.items()})
            with torch.no_grad():
                out = h.workload.reference(all_inputs, h.params, h.world)[h.rank]
            return {k: v.to(h.dev) for k, v in out.items()}

        before = h.references.corrupted
        ref = h.references.get_or_compute((self.seed, trial), compute)
        if h.references.corrupted != before:
            self.notes.append("a cached reference output changed in device memory since it was stored (a stray "
                              "store?); it was recomputed")
        return ref

    def _record_oracle(self, trial: int, snap: dict[str, torch.Tensor], what: str) -> str:
        """The seed is the oracle: keep what it delivered (already a copy) for the candidate's same iteration.
        An oracle must have written every float element: poison (NaN) or inf left in it would make any candidate
        fail, so it fails the seed instead, with the reason."""
        for name, s in snap.items():
            if s.dtype.is_floating_point:
                bad = int((~torch.isfinite(s.float())).sum())
                if bad:
                    return (f"verification failed: rank {self.h.rank}: the seed (this workload's oracle) left {bad} "
                            f"non-finite values in output {name!r} in {what}; it cannot serve as the oracle")
        self.h.oracle_outputs[trial] = snap
        return ""

    # ------------------------------------------------------------------------------------------ the levels
    def _capture_check(self) -> None:
        if self.cmd.get("capture", True):
            self.h._progress("L2", "capture", 0, 1, self.step_limit_s + 10)
            self._step(trial=10_000, what="capture pass", level="L2", verify=False, capture=True)

    def _verify_trials(self, stress: dict[str, Any] | None) -> None:
        """The L2 trials: fresh inputs, every one verified, and at world > 1 a perturbed schedule (rank/perturb.py):
        one late rank per trial, each rank in turn, with a start delay past everyone else's, the stress build's
        pauses (``stress``: the stress build is loaded) and an interference kernel, while the other ranks run
        unperturbed, so whatever a peer leaves uncovered by its flags and waits is still in flight when they
        finish."""
        h = self.h
        trials = int(self.cmd.get("trials", 3))
        configure = getattr(self.lib, "cuco_stress_configure", None) if stress else None
        if configure is not None:
            configure.argtypes = [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]
            configure.restype = ctypes.c_int
        knobs = perturb.Knobs.from_command(self.cmd, stress, configure is not None, h.sm_count,
                                           os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
        if h.world > 1:
            self.notes += perturb.describe(knobs, stress)
        for t in range(trials):
            h._progress("L2", "verify", t, trials, self.step_limit_s + 10)
            plan = perturb.plan_trial(self.seed, t, h.rank, h.world, knobs)
            if configure is not None and stress is not None:
                rc = int(configure(plan.stress_seed, plan.stress_max_ns, int(stress["permille"])))
                if rc != 0:
                    raise RuntimeError(f"cuco_stress_configure failed: {h.helpers.error_name(rc)}")
            self._step(trial=t, what=f"verification trial {t + 1}/{trials}", level="L2", verify=True, plan=plan)
        if configure is not None and int(configure(0, 0, 0)) != 0:  # the same library is timed next: no pauses
            raise RuntimeError("cuco_stress_configure could not switch the pauses off")
        h._progress("L2", "verify", trials, trials, self.step_limit_s + 10)

    def _perturb(self, plan: perturb.TrialPlan) -> None:
        """Right after this rank's device barrier: the trial's interference kernel (on a stream of its own, once the
        barrier is done and the plan's offset later), then this rank's start delay on the harness stream."""
        h = self.h
        i = plan.interference
        if i is not None:
            rc = h.helpers.cuco_h_interfere(ctypes.c_void_p(h.stream.cuda_stream), i.offset_ns, i.blocks, i.hold_ns,
                                            i.seed)
            if rc != 0:
                raise RuntimeError(f"interference launch failed: {h.helpers.error_name(rc)}")
        if plan.jitter_ns:
            rc = h.helpers.cuco_h_spin(int(plan.jitter_ns), ctypes.c_void_p(h.stream.cuda_stream))
            if rc != 0:
                raise RuntimeError(f"jitter launch failed: {h.helpers.error_name(rc)}")

    def _device_time(self, trial: int, what: str, verify: bool) -> float | None:
        """One held iteration's time; None once this candidate is timed end to end only. A stalled hold is
        retried once (a one-off, e.g. a first launch loading a module); a second stall ends device timing."""
        while self.holdable:
            ms, stalled = self._step(trial=trial, what=what, level="L3", verify=verify, held=True)
            if not stalled:
                return ms
            self.stalls += 1
            if self.stalls >= 2:
                self.holdable = False
                self.h.unholdable.add(str(self.cmd["so_path"]))
        return None

    def _timed(self) -> dict[str, Any]:
        """Warm-up (held) and timed iterations. Each timed iteration is measured twice, held (device time) and
        not (end to end), on the same inputs; the verified iterations are verified in the scoring timing.

        With a stop rule in the command ({"min_iters", "rel_ci"}), timing ends before ``iters`` once every rank's
        scoring times have a median whose distribution-free 95% interval is within ``rel_ci`` of it (stats.
        median_ci_halfwidth), after at least ``min_iters``; all ranks agree on stopping at the same iteration."""
        h = self.h
        warmup = int(self.cmd.get("warmup", 3))
        iters = int(self.cmd.get("iters", 20))
        rule = self.cmd.get("stop") or None
        check = set(verified_iterations(iters, int(self.cmd.get("verify_every", 3)), self.seed))
        wanted = h.workload.timing
        if not self.holdable:
            self.notes.append(NO_HOLD_NOTE)
        with self.clock.phase("warmup"):
            for i in range(warmup):
                h._progress("L3", "warmup", i, warmup, self.step_limit_s + 10)
                self._device_time(1000 + i, f"warm-up {i + 1}/{warmup}", verify=False)
        device: list[float] = []
        e2e: list[float] = []
        for i in range(iters):
            h._progress("L3", "timed", i, iters, self.step_limit_s + 10)
            what = f"timed iteration {i + 1}/{iters}"
            with self.clock.phase("device_timing"):
                d = self._device_time(2000 + i, what, verify=i in check and wanted == "device")
            if d is not None:
                device.append(d)
            with self.clock.phase("e2e_timing"):
                e2e.append(self._step(trial=2000 + i, what=f"{what} (end to end)", level="L3",
                                      verify=i in check and (wanted == "end_to_end" or d is None))[0])
            if rule and i + 1 >= int(rule["min_iters"]) and i + 1 < iters:
                scoring = device if wanted == "device" and len(device) == i + 1 else e2e
                tight = median_ci_halfwidth(scoring) <= float(rule["rel_ci"]) * statistics.median(scoring)
                if h._host_max(0 if tight else 1) == 0:
                    self.notes.append(f"timing stopped after {i + 1} of {iters} iterations: the median's 95% "
                                      f"interval was within {float(rule['rel_ci']):.1%} on every rank")
                    break
        h._progress("L3", "timed", iters, iters, self.step_limit_s + 10)
        if len(device) < len(e2e):  # the hold stalled (now or in an earlier evaluation): no device time at all
            device = []
            if self.stalls:
                self.notes.append(NO_HOLD_NOTE)
        score = "device" if wanted == "device" and device else "end_to_end"
        return {"times_ms": device if score == "device" else e2e, "device_ms": device or None, "e2e_ms": e2e,
                "timing": score}

    def _profiled_iterations(self, n: int) -> list[dict[str, Any]]:
        """``n`` more iterations, each under a torch.profiler of its own (CUDA activity): every kernel the step
        launched, from the candidate's library too, with its stream and ns timestamps, held as the device time is
        (when it can be). A profile per iteration keeps each iteration's rows apart (row key "iteration"), so the
        kernels of one step can be told from the next step's input preparation. Never part of the timed numbers."""
        rows: list[dict[str, Any]] = []
        for i in range(n):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                self._step(trial=3000 + i, what=f"profiled iteration {i + 1}/{n}", level="L3", verify=False,
                           held=self.holdable)
            rows += [{**r, "iteration": i} for r in kernel_rows(prof.events(), self.h.rank)]
        return rows


def kernel_rows(events: Any, rank: int) -> list[dict[str, Any]]:
    """torch.profiler events -> Gantt rows {rank, stream, name, start_us, dur_us} of the GPU kernels and copies.
    The harness's own barrier and L2-flush kernels are kept: they show where the timed region starts."""
    rows: list[dict[str, Any]] = []
    for e in events:
        kind = str(getattr(e, "device_type", "")).rsplit(".", 1)[-1]
        if kind != "CUDA":
            continue
        rng = getattr(e, "time_range", None)
        if rng is None:
            continue
        rows.append({"rank": rank, "stream": int(getattr(e, "device_resource_id", 0) or 0), "name": str(e.name),
                     "start_us": float(rng.start), "dur_us": float(rng.end - rng.start)})
    rows.sort(key=lambda r: r["start_us"])
    return rows


def abi_dtype(name: str) -> int:
    return DTYPES[name][0]
