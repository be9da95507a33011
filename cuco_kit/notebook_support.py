"""Small helpers the notebooks call, so each notebook stays a few readable lines.

What lives here: reading the smoke / browser-test switches, finding the repository and its samples from any
working directory (JupyterLab may run a copy of notebooks/ elsewhere), choosing an evaluator honestly (a GPU when
there is one; otherwise the committed recorded real run, replayed and said so; otherwise the SIMULATED landscape,
labelled as such), starting the fake OpenAI-compatible server with labelled fixture answers for smoke runs,
loading measured benchmark JSON for the teaching notebook, the formula-based overlap bound, and the check that a
notebook left no stray thread, child process or server behind.

No ipywidgets here (the engine never imports it); rich output is plain `_repr_html_`, which IPython shows.
"""
from __future__ import annotations

import html
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.device import describe_gpus

SMOKE_ENV = "CUCO_SMOKE"
BROWSER_ENV = "CUCO_BROWSER_TEST"
EVALUATOR_ENV = "CUCO_EVALUATOR"  # force "gpu", "replay" or "simulated"
ROOT_ENV = "CUCO_REPO_ROOT"
# Recorded real searches are committed under benchmarks/search/ (any depth, any of these suffixes).
RECORDED_PATTERNS = ("benchmarks/search/**/*.sqlite", "benchmarks/search/**/*.sqlite3", "benchmarks/search/**/*.db")
MAIN_SAMPLE = "gemm_allgather"

_BADGE_COLOUR = {"real": "#1b5e20", "replayed": "#0d47a1", "simulated": "#b71c1c", "fixture": "#6a1b9a"}


# ---- switches ------------------------------------------------------------------------------------------------

def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def smoke() -> bool:
    """True under CUCO_SMOKE=1: tiny budgets, the fake LLM server, no GPU time (CI runs every notebook so)."""
    return _flag(SMOKE_ENV)


def browser_test() -> bool:
    """True under CUCO_BROWSER_TEST=1: a real browser drives the notebook and clicks Approve itself."""
    return _flag(BROWSER_ENV)


def auto_approve() -> bool:
    """Whether a headless smoke run should approve proposals by itself (nobody is there to click)."""
    return smoke() and not browser_test()


def banner(text: str, kind: str = "info") -> "Banner":
    """A coloured one-line note for the top of an output; `kind` is a badge name or "info"."""
    return Banner(text, kind)


@dataclass
class Banner:
    text: str
    kind: str = "info"

    def _repr_html_(self) -> str:
        colour = _BADGE_COLOUR.get(self.kind, "#37474f")
        return (f'<div style="border-left:4px solid {colour};padding:4px 8px;margin:4px 0;'
                f'background:#fafafa">{html.escape(self.text)}</div>')

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


# ---- where things are ----------------------------------------------------------------------------------------

def repo_root() -> Path:
    """The repository root (holds sample_kernels/): $CUCO_REPO_ROOT, else where this package is installed
    from (an editable install), else the working directory or one of its parents."""
    candidates: list[Path] = []
    if os.environ.get(ROOT_ENV):
        candidates.append(Path(os.environ[ROOT_ENV]).expanduser())
    candidates.append(Path(__file__).resolve().parents[1])
    cwd = Path.cwd().resolve()
    candidates += [cwd, *cwd.parents]
    for c in candidates:
        if (c / "sample_kernels").is_dir():
            return c
    raise CucoError("cannot find the cuco-kit repository (a folder with sample_kernels/): set CUCO_REPO_ROOT "
                    "to the repository root, or install the kit with `pip install -e .` from it")


def sample(name: str = MAIN_SAMPLE) -> Path:
    """The folder of a sample workload, e.g. sample("gemm_allgather")."""
    d = repo_root() / "sample_kernels" / name
    if not (d / "workload.py").is_file():
        have = sorted(p.parent.name for p in (repo_root() / "sample_kernels").glob("*/workload.py"))
        raise BadInput(f"no sample workload {name!r}; available: {', '.join(have) or 'none'}")
    return d


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(repo_root()))
    except ValueError:
        return str(path)


def main_sample() -> Path:
    """gemm_allgather (the main sample) when all its files are there, else the allgather sample, said so."""
    from cuco_kit.workload import load_workload

    for name in (MAIN_SAMPLE, "allgather"):
        try:
            wl = load_workload(sample(name))
        except CucoError:
            continue
        files = [*wl.seeds.values(), *([wl.baseline] if wl.baseline else [])]
        if wl.baseline and all((wl.directory / f).is_file() for f in files):
            if name != MAIN_SAMPLE:
                print(f"note: sample {MAIN_SAMPLE} is not complete yet (its baseline or a seed is missing); "
                      f"using sample {name} instead")
            return wl.directory
    raise CucoError("no complete sample workload (seeds and a baseline) under sample_kernels/")


def run_db(name: str) -> Path:
    """A fresh database path for a notebook's run: runs/<name>-<date>-<time>.sqlite next to the notebook."""
    d = Path.cwd() / "runs"
    d.mkdir(exist_ok=True)
    return d / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sqlite"


# ---- the recorded real run -----------------------------------------------------------------------------------

@dataclass
class RecordedRun:
    """A committed database of a real search: where it is, which run in it, and on what GPU and when."""

    path: Path
    run_id: int
    workload: str
    gpu: str
    date: str
    evaluations: int

    @property
    def detail(self) -> str:
        return ", ".join(x for x in (self.gpu, self.date) if x) or "GPU and date not recorded"


def recorded_runs(root: Path | None = None) -> list[Path]:
    """Committed recordings under benchmarks/search/, newest name last."""
    base = root or repo_root()
    found: set[Path] = set()
    for pattern in RECORDED_PATTERNS:
        found.update(p for p in base.glob(pattern) if p.is_file())
    return sorted(found)


def recorded_run_info(path: str | Path, run_id: int | None = None) -> RecordedRun:
    """Read which run a recording holds (the one with most finished evaluations unless `run_id` is given) and
    the GPU and date its evaluations were measured on."""
    from cuco_kit.store import Store

    with Store(path, readonly=True) as st:
        runs = st.runs()
        if not runs:
            raise BadInput(f"{path}: the recording holds no run")
        if run_id is None:
            counts = {r["id"]: len(st.evaluations(run_id=r["id"])) for r in runs}
            run_id = max(counts, key=lambda rid: (counts[rid], rid))
        run = st.run(run_id)
        evs = st.evaluations(run_id=run_id)
        gpu = date = ""
        for e in evs:
            prov = e.get("provenance") or {}
            if prov.get("gpu"):
                gpu, date = str(prov.get("gpu") or ""), str(prov.get("date") or "")
                break
        return RecordedRun(Path(path), int(run_id), str(run.get("workload") or ""), gpu, date, len(evs))


def open_recorded(path: str | Path | None = None):
    """(store opened read-only, RecordedRun) of the committed recording, or (None, None) when none exists."""
    from cuco_kit.store import Store

    paths = [Path(path)] if path else recorded_runs()
    if not paths:
        return None, None
    info = recorded_run_info(paths[-1])
    return Store(info.path, readonly=True), info


# ---- choosing an evaluator -----------------------------------------------------------------------------------

@dataclass
class EvaluatorChoice:
    """The evaluator a notebook uses and, in plain words, what its numbers are."""

    evaluator: Any
    kind: str  # "gpu" | "replay" | "simulated"
    badge: str  # "real" | "replayed" | "simulated"
    message: str
    recorded: RecordedRun | None = None

    def _repr_html_(self) -> str:
        return Banner(self.message, self.badge)._repr_html_()

    def __str__(self) -> str:
        return self.message

    def close(self) -> None:
        """Release what the evaluator holds (warm rank workers, MPS, the replay database)."""
        close = getattr(self.evaluator, "close", None)
        if callable(close):
            close()


def simulated_evaluator(seed: int = 0, **kwargs: Any) -> EvaluatorChoice:
    from cuco_kit.evaluate.simulated import SimulatedEvaluator

    return EvaluatorChoice(SimulatedEvaluator(seed, **kwargs), "simulated", "simulated",
                           "SIMULATED: a synthetic latency landscape made up from the knob values; these numbers "
                           "are not measurements of anything")


def pick_evaluator(prefer: str | None = None, *, seed: int = 0) -> EvaluatorChoice:
    """The evaluator for this machine: the GPU cascade when a GPU is present (not in smoke runs, which never
    spend GPU time unless asked), else the replay evaluator over the committed recorded real run, else -- when
    no recording exists yet -- the SIMULATED landscape. `prefer` (or $CUCO_EVALUATOR) forces one of "gpu",
    "replay", "simulated"; forcing what is unavailable is an error that says why."""
    want = (prefer or os.environ.get(EVALUATOR_ENV) or "").strip().lower() or None
    if want not in (None, "gpu", "replay", "simulated"):
        raise BadInput(f"evaluator {want!r}: use gpu, replay or simulated")
    if want in (None, "gpu") and (want == "gpu" or not smoke()):
        name = describe_gpus()
        if name:
            from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator

            return EvaluatorChoice(GpuEvaluator(), "gpu", "real", f"real measurements on this machine's {name}")
        if want == "gpu":
            raise BadInput("evaluator 'gpu' asked for, but no GPU is visible here (nvidia-smi lists none); "
                           "use 'replay' to see the recorded real run")
    if want in (None, "replay"):
        paths = recorded_runs()
        if paths:
            from cuco_kit.evaluate.replay import ReplayEvaluator

            info = recorded_run_info(paths[-1])
            why = "smoke run" if smoke() else "no GPU"
            return EvaluatorChoice(ReplayEvaluator(str(info.path)), "replay", "replayed",
                                   f"{why}: showing the recorded real run ({info.detail}) from {_rel(info.path)}; "
                                   "numbers are replayed measurements, nothing runs on a GPU now", info)
        if want == "replay":
            raise BadInput("evaluator 'replay' asked for, but no recorded run exists yet under benchmarks/search/")
    choice = simulated_evaluator(seed)
    if want is None:
        choice.message = ("no GPU here and no recorded real run exists yet (benchmarks/search/ is empty): " +
                          choice.message)
    return choice


# ---- the fake LLM for smoke runs -----------------------------------------------------------------------------

_SERVERS: list[Any] = []
_SERVERS_LOCK = threading.Lock()


def fake_llm_for_smoke(fixtures: Iterable[Any] | None = None, *, store: Any = None, run_id: int | None = None,
                       **config: Any) -> tuple[Any, Any]:
    """Start the fake OpenAI-compatible server on 127.0.0.1 with scripted FIXTURE answers and return
    (client, server). Every answer is labelled a fixture (model "fixture-<name>"). With `store`, calls go
    through the ledger into that store. Stop it with server.stop() or `cleanup()`.

    `fixtures`: Scripted entries (cuco_kit.llm.fake_server.answer(...)) or dicts of their fields."""
    from cuco_kit.llm import Ledger, LedgeredClient, OpenAICompatibleClient
    from cuco_kit.llm.fake_server import FakeOpenAIServer, Scripted

    script = [f if isinstance(f, Scripted) else Scripted.from_dict(dict(f)) for f in (fixtures or [])]
    server = FakeOpenAIServer(script).start()
    with _SERVERS_LOCK:
        _SERVERS.append(server)
    client: Any = OpenAICompatibleClient(server.config(**config))
    if store is not None:
        client = LedgeredClient(client, Ledger(store, run_id))
    return client, server


def cleanup() -> int:
    """Stop every fake server started here; returns how many were still running."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS)
        _SERVERS.clear()
    running = [s for s in servers if s.running]
    for s in running:
        s.stop()
    return len(running)


def running_fake_servers() -> list[Any]:
    with _SERVERS_LOCK:
        return [s for s in _SERVERS if s.running]


# ---- leaving nothing behind ----------------------------------------------------------------------------------

def child_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """Living descendants of `pid` (default: this process) as (pid, command line), read from /proc."""
    root = os.getpid() if pid is None else pid
    parent_of: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if fields and fields[0] != "Z":
            parent_of[int(d.name)] = int(fields[1])
    out, frontier = [], {root}
    while frontier:
        kids = {p for p, pp in parent_of.items() if pp in frontier}
        frontier = kids
        for k in sorted(kids):
            try:
                cmd = (Path("/proc") / str(k) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                cmd = "?"
            out.append((k, cmd))
    return out


def leftovers(baseline: Iterable[int] = (), *, wait_s: float = 5.0) -> list[str]:
    """What a notebook left running: threads started since `baseline` (thread idents at its start) that are
    non-daemon or named cuco-*, running fake servers, and child processes. Waits up to `wait_s` for things
    that are already ending (a throttle's last timer, a joined worker)."""
    known = set(baseline)
    deadline = time.monotonic() + wait_s
    while True:
        threads = [t for t in threading.enumerate()
                   if t is not threading.main_thread() and t.ident not in known and t.is_alive()
                   and (not t.daemon or t.name.startswith("cuco-"))]
        problems = [f"thread {t.name!r} (daemon={t.daemon}) still alive" for t in threads]
        problems += [f"fake LLM server on port {s.port} still running" for s in running_fake_servers()]
        problems += [f"child process {pid}: {cmd[:120]}" for pid, cmd in child_processes()]
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.1)


def thread_baseline() -> list[int]:
    """Idents of the threads alive now (call at a notebook's start; pass to `leftovers`)."""
    return [t.ident for t in threading.enumerate() if t.ident is not None]


# ---- waiting for a background run (smoke runs only: interactive cells never block) ---------------------------

def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> None:
    """Poll `predicate` until true or raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(poll)


# ---- teaching: measured data and the overlap bound -----------------------------------------------------------

def load_benchmarks(pattern: str = "benchmarks/gemm_allgather/*.json") -> list[tuple[Path, Any]]:
    """Every committed benchmark JSON matching `pattern` (relative to the repository), parsed; [] when none."""
    out = []
    for p in sorted(repo_root().glob(pattern)):
        try:
            out.append((p, json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            raise BadInput(f"{p}: not readable JSON ({exc}); fix or remove the file") from None
    return out


def benchmark_frame(items: list[tuple[Path, Any]]):
    """One pandas row per measured record, whatever list the JSON keeps them in ("results", "rows",
    "records", "points" or a top-level list); top-level scalars (gpu, date, nccl ...) are copied onto each row."""
    import pandas as pd

    frames = []
    for path, data in items:
        rows: Any = data
        top: dict[str, Any] = {}
        if isinstance(data, dict):
            top = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
            for key in ("results", "rows", "records", "points", "measurements"):
                if isinstance(data.get(key), list):
                    rows = data[key]
                    break
            else:
                rows = [data]
        if not isinstance(rows, list):
            continue
        df = pd.json_normalize([r for r in rows if isinstance(r, dict)])
        for k, v in top.items():
            if k not in df.columns:
                df[k] = v
        df["file"] = path.name
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def overlap_bound(compute_ms: float, comm_ms: float, chunks: int = 1) -> dict[str, float]:
    """Formula, not a measurement. Sequential: compute + comm. With the transfer cut into `chunks` pieces and
    each piece's compute starting when it lands, the pipeline takes about max(c, m) + min(c, m) / chunks (the
    first piece cannot overlap anything). Perfect overlap is max(c, m), so the speed-up over sequential is at
    most (c + m) / max(c, m) <= 2."""
    if compute_ms < 0 or comm_ms < 0 or chunks < 1:
        raise BadInput("overlap_bound needs compute_ms >= 0, comm_ms >= 0 and chunks >= 1")
    seq = compute_ms + comm_ms
    hi, lo = max(compute_ms, comm_ms), min(compute_ms, comm_ms)
    piped = hi + lo / chunks
    return {"sequential_ms": seq, "pipelined_ms": piped, "perfect_overlap_ms": hi,
            "speedup_pipelined": seq / piped if piped else 1.0, "speedup_bound": seq / hi if hi else 1.0}


def workload_counts(workload_dir: str | Path, params: dict[str, int] | None = None,
                    worlds: Iterable[int] = (1, 2, 4, 8)):
    """The workload's own flop and byte counts per rank (formulas in its workload.py, not measurements): a
    pandas frame with world, flops, bytes received and flops per byte received."""
    import pandas as pd

    from cuco_kit.workload import load_workload

    wl = load_workload(workload_dir)
    p = wl.resolve(params)
    if wl.flops is None or wl.comm_bytes is None:
        raise BadInput(f"workload {wl.name} does not declare flops/comm_bytes")
    rows = []
    for w in worlds:
        try:
            f, b = wl.flops(p, w), wl.comm_bytes(p, w)
        except BadInput:
            continue  # sizes that do not split over w ranks
        rows.append({"world": w, "GFLOP per rank": f / 1e9, "MB received per rank": b / 1e6,
                     "flops per byte received": (f / b) if b else float("inf")})
    return pd.DataFrame(rows)


def model_schedule(compute: float, comm: float, chunks: int, ranks: int = 1) -> list[dict[str, Any]]:
    """Events {rank, stream, name, start_us, dur_us} of the MODEL behind `overlap_bound` (arbitrary time units):
    the transfer in `chunks` pieces on one stream, each piece's compute on another once it has landed. For
    drawing with TimelineView under a "model" badge; not a measurement."""
    if chunks < 1:
        raise BadInput("chunks must be >= 1")
    out: list[dict[str, Any]] = []
    c, m = compute / chunks, comm / chunks
    for r in range(ranks):
        comp_free = 0.0
        for i in range(chunks):
            landed = (i + 1) * m
            out.append({"rank": r, "stream": 1, "name": "transfer", "start_us": i * m, "dur_us": m})
            start = max(landed, comp_free)
            out.append({"rank": r, "stream": 0, "name": "compute", "start_us": start, "dur_us": c})
            comp_free = start + c
    return out


# ---- searches and evaluations from a notebook ----------------------------------------------------------------

def new_search(workload_dir: str | Path, evaluator: Any, *, db: str | Path, gate: str = "manual",
               generations: int = 10, proposals_per_generation: int = 4, world_size: int = 2,
               backend: str = "symm", params: dict[str, int] | None = None, iters: int = 20, seed: int = 0,
               llm: Any = None, config: Any = None) -> tuple[Any, Any]:
    """A SearchEngine wired for a notebook, not started: the offline design-space source (plus the LLM
    sources when `llm`, an LLM client, is given), an event bus for the widgets and a store at `db`.
    `config` (a SearchConfig or its dict, e.g. a recorded run's) overrides the keyword settings except the gate
    and the budget. Returns (engine, store)."""
    from cuco_kit.events import EventBus
    from cuco_kit.search.budget import BudgetConfig
    from cuco_kit.search.config import SearchConfig
    from cuco_kit.search.design_space import DesignSpaceSource
    from cuco_kit.search.engine import SearchEngine
    from cuco_kit.store import Store

    if config is None:
        cfg = SearchConfig(world_size=world_size, backend=backend, params=dict(params or {}), iters=iters,
                           seed=seed, proposals_per_generation=proposals_per_generation)
    else:
        cfg = config if isinstance(config, SearchConfig) else SearchConfig.from_dict(dict(config))
    cfg.gate = gate
    cfg.budget = BudgetConfig(generations=generations)
    sources: list[Any] = [DesignSpaceSource(cfg.design_space)]
    if llm is not None:
        from cuco_kit.search.llm_source import LLMSource

        sources.append(LLMSource(llm))
    store = Store(db)
    engine = SearchEngine(workload_dir, store, evaluator, sources, cfg, EventBus())
    return engine, store


def start_search(engine: Any, timeout: float = 60.0) -> Any:
    """Start the engine's worker thread and return once its run exists in the store (a fraction of a second:
    the dashboard needs the run id). Raises what stopped the engine if it failed during set-up."""
    engine.start()
    wait_for(lambda: engine.run_id is not None or engine.join(0), timeout, "search set-up")
    if engine.run_id is None:
        raise CucoError(f"the search did not start: {engine.error or engine.reason or 'unknown reason'}")
    return engine


def end_search(engine: Any, *, timeout: float = 120.0, close: Iterable[Any] = ()) -> str:
    """The last cell of a search notebook. When nobody needs to click (a headless smoke run, or a gate in
    "auto" mode) it waits for the budget to end the run, stops the engine, joins its thread and then closes
    `close` in order (dashboard before store). An interactive run with a manual gate is left running -- press
    Stop on the dashboard -- because a cell waiting here would also hold up the buttons."""
    if not (auto_approve() or engine.gate.mode == "auto"):
        return ("the search keeps running in the background: review the proposals above and press Stop on the "
                "dashboard (or run `engine.stop(); engine.join()`) when you are done")
    done = engine.join(timeout)
    engine.stop()
    if not engine.join(30):
        raise TimeoutError("the search thread did not end within 30 s of stop()")
    for thing in close:
        thing.close()
    if engine.error is not None:
        raise CucoError(f"the search stopped with an error: {engine.error}")
    return f"search {engine.state}: {engine.reason}" + ("" if done else f" (stopped after {timeout:.0f} s)")


def replay_config(choice: EvaluatorChoice) -> dict[str, Any] | None:
    """The recorded run's search settings when `choice` replays it (so a seeded search asks for the same
    programs and the replay has their measurements); None otherwise."""
    if choice.kind != "replay" or choice.recorded is None:
        return None
    from cuco_kit.store import Store

    with Store(choice.recorded.path, readonly=True) as st:
        cfg = dict(st.run(choice.recorded.run_id)["config"])
    cfg.pop("workload_dir", None)
    return cfg


def finished_run(workload_dir: str | Path, *, db: str | Path | None = None, generations: int = 10):
    """(store, run_id, note) of a finished run to analyse: `db` when given (its run with most evaluations),
    else the committed recorded real run, else a small SIMULATED search run to its end here (a few seconds),
    with a note that says which."""
    if db is not None or recorded_runs():
        info = recorded_run_info(db or recorded_runs()[-1])
        from cuco_kit.store import Store

        kind = "replayed" if db is None else "info"
        what = "recorded real run" if db is None else "run"
        return (Store(info.path, readonly=True), info.run_id,
                Banner(f"{what} {info.run_id} of {info.workload} from {_rel(info.path)}: {info.evaluations} "
                       f"evaluations on {info.detail}", kind))
    sim = simulated_evaluator()
    engine, store = new_search(workload_dir, sim.evaluator, db=run_db("simulated-demo"), gate="auto",
                               generations=generations, world_size=2, backend="symm")
    engine.run()  # blocks for a few seconds: the simulator answers at once
    return store, engine.run_id, Banner(
        "No recorded real run exists yet under benchmarks/search/: this is a SIMULATED search run just now "
        f"({generations} generations; made-up numbers from a synthetic landscape, not measurements)",
        "simulated")


@dataclass
class Winner:
    """What won a run: the best passing candidate (not the seed), its knobs next to the baseline's, and a
    one-line verdict that says plainly when nothing beat the seed."""

    banner: Banner
    knobs: Any  # pandas frame: knob -> baseline value, best value
    program: dict[str, Any] | None
    baseline: dict[str, Any] | None


def what_won(store: Any, run_id: int) -> Winner:
    import pandas as pd

    from cuco_kit.report import run_frame, run_badge

    df = run_frame(store, run_id)
    badge = run_badge(store, run_id)[0]
    progs = {p["id"]: p for p in store.programs(run_id)}
    baseline = next((p for p in progs.values() if p["source"] == "baseline"), None)
    seed_ms = df.loc[(df["source"] == "seed") & (df["verdict"] == "pass"), "median_ms"].min()
    cands = df[(df["verdict"] == "pass") & (df["source"] != "seed") & df["median_ms"].notna()]
    if cands.empty:
        return Winner(Banner("no candidate passed in this run", badge), pd.DataFrame(), None, baseline)
    row = cands.loc[cands["median_ms"].idxmin()]
    prog = progs[int(row["program_id"])]
    text = f"best candidate: #{prog['id']} {prog['name']!r} ({prog['source']}), {row['median_ms']:.3f} ms"
    if pd.notna(seed_ms):
        ratio = seed_ms / row["median_ms"]
        text += f", {ratio:.2f}x the seed ({seed_ms:.3f} ms)"
        if ratio <= 1.0:
            text += ": no candidate beat the seed in this run"
    text += f" [{badge}]"
    knobs = pd.DataFrame({"baseline": (baseline or {}).get("knobs") or {}, "best": prog.get("knobs") or {}})
    if not knobs.empty:
        knobs["changed"] = knobs["baseline"] != knobs["best"]
    return Winner(Banner(text, badge), knobs, prog, baseline)


def recorded_timelines(pattern: str = "benchmarks/**/timeline*.json") -> list[dict[str, Any]]:
    """Committed measured kernel timelines: dicts with "events" ({rank, stream, name, start_us, dur_us}) and,
    when recorded, "badge" and "detail" (GPU, date). [] when none is committed."""
    out = []
    for path, data in load_benchmarks(pattern):
        if isinstance(data, list):
            data = {"events": data}
        if isinstance(data, dict) and isinstance(data.get("events"), list):
            detail = data.get("detail") or ", ".join(str(data[k]) for k in ("gpu", "date") if data.get(k))
            out.append({"events": data["events"], "badge": data.get("badge", "real"), "detail": detail,
                        "path": path})
    return out


def sweep(evaluator: Any, workload_dir: str | Path, candidate: str, presets: Iterable[str], *, world_size: int,
          backend: str, iters: int = 20):
    """Evaluate one candidate file of the workload at several size presets, one after another (this blocks:
    seconds on the simulator or replay, minutes on a GPU). Returns a pandas frame, one row per preset."""
    import pandas as pd

    from cuco_kit.evaluate.api import EvalRequest
    from cuco_kit.workload import load_workload

    wl = load_workload(workload_dir)
    code = (wl.directory / candidate).read_text(encoding="utf-8")
    rows = []
    for name in presets:
        params = dict(wl.size_presets[name]) if name in wl.size_presets else {}
        res = evaluator.evaluate(EvalRequest(candidate_code=code, workload_dir=str(wl.directory), params=params,
                                             world_size=world_size, backend=backend, iters=iters,
                                             label=f"{candidate} @ {name}"))
        rows.append({"sizes": name, **wl.resolve(params), "ranks": world_size, "backend": backend,
                     "level": res.level_reached, "verdict": res.verdict, "median_ms": res.median_ms,
                     "seed_ms": res.seed_median_ms, "speedup": res.speedup, "badge": res.badge,
                     "reason": res.reason})
    return pd.DataFrame(rows)


# ---- the fast path from a notebook ---------------------------------------------------------------------------

FIXTURE_DIR = "tests/data/fastpath"  # recorded answers of the fast path on the main sample (labelled fixtures)
_FIXTURE_FILES = (("stage-a", "gemm_stage_a.cu"), ("stage-b", "gemm_stage_b_lsa.cu"),
                  ("annotate", "gemm_annotated.cu"))


def fastpath_fixtures() -> list[Any]:
    """Scripted FIXTURE answers for the fast path on gemm_allgather: Stage A, Stage B (LSA), annotate, in that
    order, and a judge answer for any failed attempt. Every answer says it is a fixture."""
    from cuco_kit.llm.fake_server import answer

    d = repo_root() / FIXTURE_DIR
    out = []
    for name, fname in _FIXTURE_FILES:
        path = d / fname
        if not path.is_file():
            raise CucoError(f"fixture answer {path} is missing; the smoke run of the fast path needs it")
        out.append(answer(name, f"FIXTURE answer (recorded, not a live model).\n\n```cuda\n{path.read_text()}```\n"))
    out.append(answer("judge", "FIXTURE diagnosis: no live model is answering in this run.",
                      match="Diagnose the failure", times=0))
    return out


def _llm_configured() -> bool:
    return bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"))


def fast_path(workload_dir: str | Path, choice: EvaluatorChoice, *, seed_file: str | None = None,
              max_attempts: int | None = None) -> tuple[Any, Banner]:
    """A FastPath over the workload's host-NCCL seed and a banner saying which LLM answers. Smoke runs, and
    machines with no LLM configured ($OPENAI_API_KEY / $OPENAI_BASE_URL unset), get the fake server with the
    recorded FIXTURE answers. L2 runs only with a real GPU evaluator; otherwise stages stop after L1 and say so."""
    from cuco_kit.fastpath import FastPath, FastPathConfig
    from cuco_kit.store import Store
    from cuco_kit.workload import load_workload

    wl = load_workload(workload_dir)
    seed_path = wl.directory / (seed_file or wl.seeds.get("nccl") or next(iter(wl.seeds.values())))
    store = Store(run_db("01_fast_path"))
    if smoke() or not _llm_configured():
        client, server = fake_llm_for_smoke(fastpath_fixtures(), max_retries=0)
        why = "smoke run" if smoke() else "no LLM configured (set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server)"
        note = Banner(f"{why}: the LLM is a local fake server on {server.base_url} answering with recorded FIXTURE "
                      "answers (model fixture-*), not a live model", "fixture")
    else:
        from cuco_kit.llm import LLMConfig, OpenAICompatibleClient

        cfg = LLMConfig()
        client = OpenAICompatibleClient(cfg)
        note = Banner(f"LLM: {cfg.model} at {cfg.base_url}", "info")
    fpc = FastPathConfig(max_attempts=max_attempts or (1 if smoke() else 3), judge=not smoke())
    evaluator = choice.evaluator if choice.kind == "gpu" else None
    fp = FastPath(seed_path.read_text(encoding="utf-8"), wl.directory, client, evaluator, store, fpc,
                  seed_name=seed_path.name)
    return fp, note


def review_attempts(fp: Any, outcome: Any, review_cls: Any) -> None:
    """Display a stage's outcome and each attempt as a side-by-side diff against the stage's input
    (`review_cls` is cuco_kit.widgets.DiffReview, passed in so this module never imports widgets). Attempts
    already decided show their verdict with the buttons disabled."""
    from IPython.display import display

    previous = {"A": None, "B": "A", "annotate": "B"}.get(outcome.stage)
    stage_input = fp.seed_code if previous is None else fp.outcomes[previous].code
    display(Banner(f"stage {outcome.stage}: {outcome.status} - {outcome.message}",
                   "info" if outcome.ok else "simulated"))
    for a in outcome.attempts:
        prop = {"id": a.proposal_id or a.number, "name": f"stage {a.stage}, attempt {a.number} ({a.source})",
                "rationale": f"{a.verdict} at {a.level or '-'}: {a.reason}"
                             + (f" | model {a.llm_model}" if a.llm_model else "")
                             + (" | FIXTURE answer" if a.fixture else ""),
                "source": a.source, "tags": ["fixture"] if a.fixture else [],
                "parent_code": stage_input, "code": a.code or ""}
        w = review_cls(prop)
        if a.verdict != "pending":
            for b in (w.approve, w.reject, w.edit):
                b.disabled = True
            w.status.value = f"<i>{html.escape(a.verdict)}</i>"
        display(w)
