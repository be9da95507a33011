"""The engine seen from a notebook: each call is one readable line in a cell.

Finds the repository and its samples from any working directory (JupyterLab may run a copy of notebooks/
elsewhere), opens the committed recorded real runs, chooses an evaluator honestly (a GPU when there is one;
otherwise the recorded real run, replayed and said so; otherwise the SIMULATED landscape, labelled as such),
and wires searches and the fast path for a notebook. Everything returned is plain data: statements about where
numbers come from are `Note`s, which the widget layer (`cuco_kit.widgets.banner`) draws.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.api import EvalRequest, Evaluator, HasRecordings, checked_against, close_evaluator
from cuco_kit.evaluate.device import describe_gpus
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.evaluate.recordings import recording_files, sizes_text
from cuco_kit.evaluate.replay import ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.llm import CallLog, LLMClient, LLMConfig, OpenAICompatibleClient, fixture_scripts
from cuco_kit.llm.fake_server import Scripted
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import Backend, SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.executor import Executor
from cuco_kit.search.gate import GateMode, gate_mode
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.start_point import StartPoint
from cuco_kit.store import ProgramRow, Store
from cuco_kit.workbench import smoke
from cuco_kit.workbench.badges import label
from cuco_kit.workload import load_workload

EVALUATOR_ENV = "CUCO_EVALUATOR"  # force "gpu", "replay" or "simulated"
ROOT_ENV = "CUCO_REPO_ROOT"
RECORDINGS_ENV = "CUCO_RECORDINGS"
RECORDINGS_DIR = "recordings"  # the repository's folder of the data the notebooks replay
MAIN_SAMPLE = "gemm_allgather"


@dataclass(frozen=True)
class Note:
    """A one-line statement for the top of an output, with the badge of the numbers it speaks about ("real",
    "replayed", "simulated", "fixture") or "info". The widget layer draws it; str() is the text."""

    text: str
    badge: str = "info"

    def __str__(self) -> str:
        return self.text


# ---- where things are ----------------------------------------------------------------------------------------

def repo_root() -> Path:
    """The repository root (holds sample_kernels/): $CUCO_REPO_ROOT, else where this package is installed
    from (an editable install), else the working directory or one of its parents."""
    candidates: list[Path] = []
    if os.environ.get(ROOT_ENV):
        candidates.append(Path(os.environ[ROOT_ENV]).expanduser())
    candidates.append(Path(__file__).resolve().parents[2])
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


def main_sample() -> Path:
    """The folder of the main sample, GEMM + AllGather."""
    return sample(MAIN_SAMPLE)


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(repo_root()))
    except ValueError:
        return str(path)


def run_db(name: str) -> Path:
    """A fresh database path for a notebook's run: runs/<name>-<date>-<time>.sqlite next to the notebook."""
    d = Path.cwd() / "runs"
    d.mkdir(exist_ok=True)
    return d / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sqlite"


# ---- the recorded real runs ----------------------------------------------------------------------------------

def recordings_dir() -> Path:
    """Where the recorded real runs are: $CUCO_RECORDINGS when set, else the repository's recordings/ (where the
    recording scripts commit them, each listed in its MANIFEST.json). The one place recordings are looked for."""
    if os.environ.get(RECORDINGS_ENV):
        return Path(os.environ[RECORDINGS_ENV]).expanduser()
    return repo_root() / RECORDINGS_DIR


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


def recorded_runs(directory: Path | None = None) -> list[Path]:
    """The recordings (*.sqlite, *.sqlite3, *.db at any depth) in `directory`, default `recordings_dir()`,
    newest name last."""
    return recording_files(recordings_dir() if directory is None else Path(directory))


def recorded_searches(workload: str = MAIN_SAMPLE) -> list[Path]:
    """The recorded searches of `workload`, found by name (`<workload>-<backend><ranks>-search-*`, written by
    the search recording script); the recordings whose name starts with the workload when none is named so; all
    recordings when none does. Newest name last."""
    paths = recorded_runs()
    for pick in ([p for p in paths if p.name.startswith(f"{workload}-") and "-search-" in p.name],
                 [p for p in paths if p.name.startswith(f"{workload}-")]):
        if pick:
            return pick
    return paths


def recorded_failures(workload: str = MAIN_SAMPLE) -> list[Path]:
    """Recorded runs of `workload` that hold failures to teach from (`<workload>-*failures*`), newest last."""
    return [p for p in recorded_runs() if p.name.startswith(f"{workload}-") and "failures" in p.name]


def recorded_run_info(path: str | Path, run_id: int | None = None) -> RecordedRun:
    """Read which run a recording holds (the one with most finished evaluations unless `run_id` is given) and
    the GPU and date its evaluations were measured on."""
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
                gpu, date = str(prov.get("gpu") or ""), str(prov.get("date") or "")[:10]
                break
        return RecordedRun(Path(path), int(run_id), str(run.get("workload") or ""), gpu, date, len(evs))


def open_recorded(path: str | Path | None = None) -> tuple[Store, RecordedRun] | tuple[None, None]:
    """(store opened read-only, RecordedRun) of the newest recording, or (None, None) when none exists."""
    paths = [Path(path)] if path else recorded_searches()
    if not paths:
        return None, None
    info = recorded_run_info(paths[-1])
    return Store(info.path, readonly=True), info


# ---- choosing an evaluator -----------------------------------------------------------------------------------

@dataclass
class EvaluatorChoice:
    """The evaluator a notebook uses and, in plain words, what its numbers are."""

    evaluator: Evaluator
    kind: str  # "gpu" | "replay" | "simulated"
    badge: str  # "real" | "replayed" | "simulated"
    message: str
    recorded: RecordedRun | None = None

    @property
    def note(self) -> Note:
        """The message under the badge, for the widget layer to draw (cuco_kit.widgets.banner)."""
        return Note(self.message, self.badge)

    def __str__(self) -> str:
        return self.message

    def close(self) -> None:
        """Release what the evaluator holds (warm rank workers, MPS, the replay database)."""
        close_evaluator(self.evaluator)


def simulated_evaluator(seed: int = 0, **kwargs: Any) -> EvaluatorChoice:
    return EvaluatorChoice(SimulatedEvaluator(seed, **kwargs), "simulated", "simulated",
                           "SIMULATED: a synthetic latency landscape made up from the knob values; these numbers "
                           "are not measurements of anything")


def pick_evaluator(prefer: str | None = None, *, seed: int = 0) -> EvaluatorChoice:
    """The evaluator for this machine: the GPU cascade when a GPU is present (not in smoke runs, which never
    spend GPU time unless asked), else the replay evaluator over the newest recorded real run, else -- when
    no recording exists yet -- the SIMULATED landscape. `prefer` (or $CUCO_EVALUATOR) forces one of "gpu",
    "replay", "simulated"; forcing what is unavailable is an error that says why."""
    want = (prefer or os.environ.get(EVALUATOR_ENV) or "").strip().lower() or None
    if want not in (None, "gpu", "replay", "simulated"):
        raise BadInput(f"evaluator {want!r}: use gpu, replay or simulated")
    if want in (None, "gpu") and (want == "gpu" or not smoke.enabled()):
        name = describe_gpus()
        if name:
            return EvaluatorChoice(GpuEvaluator(), "gpu", "real", f"real measurements on this machine's {name}")
        if want == "gpu":
            raise BadInput("evaluator 'gpu' asked for, but no GPU is visible here (nvidia-smi lists none); "
                           "use 'replay' to see the recorded real run")
    where = _rel(recordings_dir()) + "/"
    if want in (None, "replay"):
        paths = recorded_runs()
        if paths:
            info = recorded_run_info(recorded_searches()[-1])
            why = "smoke run" if smoke.enabled() else "no GPU"
            return EvaluatorChoice(ReplayEvaluator(paths), "replay", "replayed",
                                   f"{why}: replaying real measurements ({info.detail}) from {len(paths)} "
                                   f"recording(s) in {where}; nothing runs on a GPU now. Only recorded "
                                   "programs and configurations have numbers; the recorded search is "
                                   f"{_rel(info.path)}", info)
        if want == "replay":
            raise BadInput(f"evaluator 'replay' asked for, but no recorded run exists yet under {where}")
    choice = simulated_evaluator(seed)
    if want is None:
        choice.message = f"no GPU here and no recorded real run exists yet ({where} is empty): " + choice.message
    return choice


# ---- searches and evaluations from a notebook ----------------------------------------------------------------

def new_search(workload_dir: str | Path, evaluator: Evaluator, *, db: str | Path, gate: GateMode = "manual",
               generations: int = 10, proposals_per_generation: int = 4, world_size: int = 2,
               backend: Backend = "symm", params: dict[str, int] | None = None, iters: int = 20, seed: int = 0,
               llm: LLMClient | None = None,
               config: SearchConfig | dict[str, Any] | None = None,
               executor: Executor | None = None, start: StartPoint | None = None,
               llm_calls: CallLog | None = None) -> tuple[SearchEngine, Store]:
    """A SearchEngine wired for a notebook, not started: the offline design-space source (plus the LLM
    sources when `llm`, an LLM client, is given), an event bus for the widgets and a store at `db`.
    `config` (a SearchConfig or its dict, e.g. a recorded run's) overrides the keyword settings except the gate
    and the budget. `executor`: where evaluations run (cuco_kit.search.slots.local_executor for this host's GPU
    sets, cuco_kit.search.ray_executor.ray_executor for a Ray cluster; it is also the evaluator to pass then);
    default one evaluator in this kernel. `start` (search/start_point.py) starts from a fast-path result instead of
    the baseline. `llm_calls`: CallLog.record(folder) keeps every LLM call and its answer there, CallLog.replay(folder)
    answers them from it (then `llm` may be None: no server is asked). Returns (engine, store)."""
    if config is None:
        cfg = SearchConfig(world_size=world_size, backend=backend, params=dict(params or {}), iters=iters,
                           seed=seed, proposals_per_generation=proposals_per_generation)
    else:
        cfg = config if isinstance(config, SearchConfig) else SearchConfig.from_dict(dict(config))
    cfg.gate = gate_mode(gate)  # checked: a notebook may pass any string
    cfg.budget = BudgetConfig(generations=generations)
    sources: list[Any] = [DesignSpaceSource(cfg.design_space)]
    if llm_calls is not None and (llm is not None or llm_calls.mode == "replay"):
        llm = llm_calls.wrap(llm)
    if llm is not None:
        sources.append(LLMSource(llm))
    store = Store(db)
    engine = SearchEngine(workload_dir, store, evaluator, sources, cfg, EventBus(), executor=executor, start=start)
    return engine, store


def start_search(engine: SearchEngine, timeout: float = 60.0) -> SearchEngine:
    """Start the engine's worker thread and return once its run exists in the store (a fraction of a second:
    the dashboard needs the run id). Raises what stopped the engine if it failed during set-up."""
    engine.start()
    smoke.wait_for(lambda: engine.run_id is not None or engine.join(0), timeout, "search set-up")
    if engine.run_id is None:
        raise CucoError(f"the search did not start: {engine.error or engine.reason or 'unknown reason'}")
    return engine


def end_search(engine: SearchEngine, *, timeout: float = 120.0, close: Iterable[Any] = ()) -> str:
    """The last cell of a search notebook. When nobody needs to click (a headless smoke run, or a gate in
    "auto" mode) it waits for the budget to end the run, stops the engine, joins its thread and then closes
    `close` in order (dashboard before store). An interactive run with a manual gate is left running -- press
    Stop on the dashboard -- because a cell waiting here would also hold up the buttons."""
    if not (smoke.auto_approve() or engine.gate.mode == "auto"):
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
    with Store(choice.recorded.path, readonly=True) as st:
        cfg = dict(st.run(choice.recorded.run_id)["config"])
    cfg.pop("workload_dir", None)
    return cfg


def search_settings(choice: EvaluatorChoice, workload_dir: str | Path, *, world_size: int, backend: str,
                    preset: str) -> tuple[dict[str, Any], Note]:
    """The settings a notebook's search runs with, and a note that says them: the ones asked for, except when
    replaying, where the recorded search's own settings are used (so its programs have measurements) and the
    note says so instead of running other settings silently."""
    wl = load_workload(workload_dir)
    cfg = replay_config(choice)
    if cfg is None:
        params = dict(wl.size_presets.get(preset, {}))
        return ({"world_size": world_size, "backend": backend, "params": params, "config": None},
                Note(f"search settings: {world_size} ranks, {backend}, {sizes_text(wl.resolve(params))} "
                     f"({preset})", choice.badge))
    ranks, bk = int(cfg.get("world_size", world_size)), str(cfg.get("backend", backend))
    sizes = sizes_text(wl.resolve(cfg.get("params") or {}))
    return ({"world_size": ranks, "backend": bk, "params": dict(cfg.get("params") or {}), "config": cfg},
            Note(f"replaying: the search uses the recorded search's settings ({ranks} ranks, {bk}, {sizes}), not "
                 f"{world_size} ranks {backend} at {preset}, because only what was recorded has measurements; "
                 "with a GPU the settings asked for are used", "replayed"))


def finished_run(workload_dir: str | Path, *, db: str | Path | None = None,
                 generations: int = 10) -> tuple[Store, int, Note]:
    """(store, run_id, note) of a finished run to analyse: `db` when given (its run with most evaluations),
    else the newest recorded real run of the workload that has failures to teach from, else its newest recorded
    search, else a small SIMULATED search run to its end here (a few seconds), with a note that says which."""
    name = Path(workload_dir).name
    recorded = recorded_failures(name) or recorded_searches(name)
    if db is not None or recorded:
        info = recorded_run_info(db or recorded[-1])
        badge = "replayed" if db is None else "info"
        what = "recorded real run" if db is None else "run"
        return (Store(info.path, readonly=True), info.run_id,
                Note(f"{what} {info.run_id} of {info.workload} from {_rel(info.path)}: {info.evaluations} "
                     f"evaluations on {info.detail}", badge))
    sim = simulated_evaluator()
    engine, store = new_search(workload_dir, sim.evaluator, db=run_db("simulated-demo"), gate="auto",
                               generations=generations, world_size=2, backend="symm")
    summary = engine.run()  # blocks for a few seconds: the simulator answers at once
    return store, summary.run_id, Note(
        f"No recorded real run exists yet under {_rel(recordings_dir())}/: this is a SIMULATED search run just "
        f"now ({generations} generations; made-up numbers from a synthetic landscape, not measurements)",
        "simulated")


@dataclass
class Winner:
    """What won a run: the best passing candidate (not the seed), its knobs next to the baseline's, and a
    one-line verdict that says plainly when nothing beat the seed."""

    note: Note
    knobs: Any  # pandas frame: knob -> baseline value, best value
    program: ProgramRow | None
    baseline: ProgramRow | None


def what_won(store: Store, run_id: int) -> Winner:
    import pandas as pd

    from cuco_kit.workbench.report import run_badge, run_frame  # imports pandas

    df = run_frame(store, run_id)
    badge, detail = run_badge(store, run_id)
    progs = {p["id"]: p for p in store.programs(run_id)}
    baseline = next((p for p in progs.values() if p["source"] == "baseline"), None)
    seed_ms = df.loc[(df["source"] == "seed") & (df["verdict"] == "pass"), "median_ms"].min()
    cands = df[(df["verdict"] == "pass") & (df["source"] != "seed") & df["median_ms"].notna()]
    if cands.empty:
        return Winner(Note("no candidate passed in this run", badge), pd.DataFrame(), None, baseline)
    row = cands.loc[cands["median_ms"].idxmin()]
    prog = progs[int(row["program_id"])]
    text = f"best candidate: #{prog['id']} {prog['name']!r} ({prog['source']}), {row['median_ms']:.3f} ms"
    if pd.notna(seed_ms):
        ratio = seed_ms / row["median_ms"]
        text += f", {ratio:.2f}x the seed ({seed_ms:.3f} ms)"
        if ratio <= 1.0:
            text += ": no candidate beat the seed in this run"
    text += f" [{label(badge, detail)}]"
    knobs = pd.DataFrame({"baseline": (baseline["knobs"] or {}) if baseline else {}, "best": prog.get("knobs") or {}})
    if not knobs.empty:
        knobs["changed"] = knobs["baseline"] != knobs["best"]
    return Winner(Note(text, badge), knobs, prog, baseline)


def preset_of(workload_dir: str | Path, sizes: dict[str, int]) -> str | None:
    """The name of the workload's size preset that resolves to `sizes` ("default" for the defaults), or None."""
    wl = load_workload(workload_dir)
    for name, params in {"default": {}, **wl.size_presets}.items():
        if wl.resolve(params) == dict(sizes):
            return name
    return None


def sweep_plan(choice: EvaluatorChoice, workload_dir: str | Path, *, world_size: int = 2, backend: str = "symm",
               presets: Iterable[str] = ("small", "4096", "8192")) -> tuple[list[str], int, str, Note]:
    """(presets, world size, backend, note) of a size sweep this evaluator can answer: the ones asked for, except
    when replaying, where the recorded world size and backend with the most recorded presets are used."""
    if choice.kind != "replay" or not isinstance(choice.evaluator, HasRecordings):
        want = list(presets)
        return want, world_size, backend, Note(f"sweep: {', '.join(want)} at {world_size} ranks, {backend}",
                                               choice.badge)
    by_world: dict[tuple[int, str], list[str]] = {}
    for c in choice.evaluator.configs(str(Path(workload_dir).resolve())):
        name = preset_of(workload_dir, c.sizes)
        if name is not None and name not in by_world.setdefault((c.world_size, c.backend), []):
            by_world[(c.world_size, c.backend)].append(name)
    if not by_world:
        return [], world_size, backend, Note("sweep: no size preset of this workload is recorded; nothing to "
                                             "replay (a GPU measures any preset)", "replayed")
    (ranks, bk), names = max(by_world.items(), key=lambda kv: (len(kv[1]), -kv[0][0]))
    return names, ranks, bk, Note(f"sweep: the recorded presets {', '.join(names)} at {ranks} ranks, {bk} (only "
                                  "recorded configurations have numbers here)", "replayed")


def sweep(evaluator: Evaluator, workload_dir: str | Path, candidate: str, presets: Iterable[str], *,
          world_size: int, backend: str, iters: int = 20) -> Any:
    """Evaluate one candidate file of the workload at several size presets, one after another (this blocks:
    seconds on the simulator or replay, minutes on a GPU). Returns a pandas frame, one row per preset."""
    import pandas as pd

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
                     "checked": checked_against(res.oracle), "reason": res.reason})
    return pd.DataFrame(rows)


# ---- the fast path from a notebook ---------------------------------------------------------------------------

def fastpath_fixtures() -> list[Scripted]:
    """Scripted FIXTURE answers for the fast path on gemm_allgather, chosen by what each prompt asks: per stage
    (Stage A, Stage B (LSA), annotate) a first answer and a retry answer, and a judge answer for any failed
    attempt. Every answer says it is a fixture."""
    return fixture_scripts.gemm_fastpath()


def llm_configured() -> bool:
    return bool(os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"))


def fast_path(workload_dir: str | Path, choice: EvaluatorChoice, *, seed_file: str | None = None,
              max_attempts: int | None = None, manual: bool = False,
              llm_calls: CallLog | None = None) -> tuple[FastPath, Note]:
    """A FastPath over the workload's host-NCCL seed and a note saying which LLM answers. Smoke runs, and
    machines with no LLM configured ($OPENAI_API_KEY / $OPENAI_BASE_URL unset), get the fake server with the
    recorded FIXTURE answers. L2 runs only with a real GPU evaluator; otherwise stages stop after L1 and say so.
    `manual`: every attempt waits for approve / reject(note) / edit (the notebook's FastPathStepper).
    `llm_calls`: CallLog.record(folder) keeps every LLM call and its answer there; CallLog.replay(folder) answers
    them from it, with no server, fake or live."""
    wl = load_workload(workload_dir)
    seed_path = wl.directory / (seed_file or wl.seeds.get("nccl") or next(iter(wl.seeds.values())))
    store = Store(run_db("01_fast_path"))
    client: LLMClient
    if llm_calls is not None and llm_calls.mode == "replay":
        client = llm_calls.wrap(None)
        note = Note(f"LLM answers replayed from {llm_calls.path} (recorded earlier; no server is asked)", "info")
    elif smoke.enabled() or not llm_configured():
        client, server = smoke.fake_llm_for_smoke(fastpath_fixtures(), max_retries=0)
        why = ("smoke run" if smoke.enabled()
               else "no LLM configured (set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server)")
        note = Note(f"{why}: the LLM is a local fake server on {server.base_url} answering with recorded FIXTURE "
                    "answers (model fixture-*), not a live model", "fixture")
    else:
        cfg = LLMConfig()
        client = OpenAICompatibleClient(cfg)
        note = Note(f"LLM: {cfg.model} at {cfg.base_url}", "info")
    if llm_calls is not None and llm_calls.mode == "record":
        client = llm_calls.wrap(client)
        note = Note(f"{note.text}; every call recorded to {llm_calls.path}", note.badge)
    # A person who rejects must get a retry, smoke run or not; only a headless automatic smoke run keeps one.
    fpc = FastPathConfig(max_attempts=max_attempts or (1 if smoke.enabled() and not manual else 3),
                         judge=not smoke.enabled(), manual=manual)
    evaluator = choice.evaluator if choice.kind == "gpu" else None
    fp = FastPath(seed_path.read_text(encoding="utf-8"), wl.directory, client, evaluator, store, fpc,
                  seed_name=seed_path.name)
    return fp, note
