"""`SearchEngine`: the evolutionary loop that ties sources, gate, executor, store and events together.

One generation (a "round"): for each of ``proposals_per_generation`` slots, pick an island (slots go round the
islands), draw a mutation kind from the phase's mix, select a parent on that island and ask the source that
serves the kind; design-space slots with the same parent share one Optuna study (so constant-liar sampling
spreads them). Proposals are de-duplicated by code hash, filtered for novelty, stored, and passed through the
approval gate; approved ones become programs (stored before any is evaluated), then the executor evaluates
them, and the generation ends with migration, phase switching and, now and then, the meta-summary. A program
about to be announced as the run's best over the seed, or copied as a migrant, is measured again beside the seed
first and promoted only if its advantage holds (search/remeasure.py; the policy is here, the store only keeps the
evaluations).

When a search ends: a budget is spent (generations, wall time, evaluations, LLM dollars), ``stop()`` is called, a
program beats ``SearchConfig.target_ratio`` with its interval clear of it (search/target.py), or it has nothing new
to propose. A round of design-space slots only that finds no knob setting the run has not tried
ends it at once ("design space exhausted": for a space of up to ``DesignSpaceConfig.enumerable_points`` points the
source walks the untried points when its sampler finds none, so it answers nothing only when none is left); rounds
with LLM slots end it after ``SearchConfig.max_empty_generations`` in a row brought nothing new. A person's
decision or edit that adds a program lifts either (its children may be new); proposals waiting for a person keep
the search waiting.

Reproducibility: each round draws from ``Random(f"{seed}/{generation}")`` and sees only results committed in
earlier rounds, so with a deterministic evaluator (simulated or replayed) the same seed gives the same programs,
in the same order, even across any number of kills and resumes.

One owner: a search owns its database (``Store.acquire_owner``, an OS file lock the kernel drops when the
process dies) from set-up until ``run()`` returns, before it reads anything to resume from. A second search on
the same file -- by any path to it, in another process or this one -- is refused with the owner's pid and host
(a file with a second hard link is refused for writing at all); read-only Stores (dashboards) may look at any
time.

Resume (also after kill -9): the store is the record. In-flight evaluations are marked interrupted
(``store.mark_interrupted``) and their programs evaluated again (the new request carries ``rerun_of``); programs
stored but never evaluated are evaluated; a root missing (a kill between seed and baseline) is added. A round's
proposals are stored in one transaction together with the run's ``round`` metadata (the round's generation and
the generation and island of every proposal waiting for the gate), so a kill leaves all of them or none: none,
and the round is proposed again, the same way; all, and the pending ones go back to the gate with their own
labels. An approved proposal's program and its decision are stored together too. The round counter, phase,
migrations and meta-summary come from the run's ``state`` metadata, written in one row at the end of each round;
a round whose proposals are stored but whose end is not is finished first. A committed evaluation is never
repeated.

Threads: ``run()`` blocks (the CLI); ``start()`` runs the same loop in a worker thread and returns at once
(notebooks). ``pause()``, ``resume()``, ``stop()``, ``gate.decide(...)`` and ``submit_human(...)`` may be called
from any thread; none of them waits for the engine.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.api import Badge, EvalRequest, EvalResult, Evaluator, badge_of
from cuco_kit.events import EventSink
from cuco_kit.llm.client import LLMBudgetExceeded
from cuco_kit.llm.ledger import Ledger
from cuco_kit.search import diagnosis, remeasure, repair, target
from cuco_kit.search import islands as islands_mod
from cuco_kit.search.archive import Archive, cell_of
from cuco_kit.search.budget import BudgetTracker
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.cost import record_proposal_llm
from cuco_kit.search.executor import Executor, PoolExecutor, error_result
from cuco_kit.search.gate import ApprovalGate
from cuco_kit.search.human import HumanEdit, HumanSource
from cuco_kit.search.meta import MetaSummarizer
from cuco_kit.search.novelty import NoveltyFilter, NoveltyVerdict, openai_embedder
from cuco_kit.search.novelty_judge import NoveltyJudge
from cuco_kit.search.phases import PhaseController, PhaseState
from cuco_kit.search.population import LINEAGE_TAG, Population, ProgramView
from cuco_kit.search.proposal import (
    BindsEngine,
    HasClient,
    Proposal,
    ProposalContext,
    ProposalSource,
    RepairsBuilds,
    ServesRoles,
)
from cuco_kit.search.selection import SelectionConfig, select_parent
from cuco_kit.search.start_point import INITIAL_TAG, StartPoint, add_lineage, read_baseline, read_initial
from cuco_kit.store import Store, code_hash
from cuco_kit.workload import load_workload

log = logging.getLogger("cuco_kit.search")

LLM_KINDS = ("diff", "full", "crossover")
WHY = {"migrant": "it migrates", "best": "it is announced as the run's best"}  # a re-measure's purpose, in words


@dataclass
class SearchSummary:
    run_id: int
    state: str
    reason: str
    generations: int
    programs: int
    evaluations: int
    best_program_id: int | None
    best_speedup: float | None
    best_median_ms: float | None
    badge: str
    duplicates_skipped: int
    novelty_rejected: int
    reruns: int
    prebuilds: int
    llm_dollars: float
    remeasures: int = 0  # evaluations that measured a program again before promoting it (search/remeasure.py)
    held_back: int = 0  # programs whose advantage did not hold when measured again

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class BindsLedger(Protocol):
    """An evaluator that makes LLM calls of its own while evaluating (an optional capability; the evaluation
    layer knows nothing of ledgers): the search hands it the run's ledger so those calls count against the
    same budget."""

    def bind_ledger(self, ledger: Ledger) -> None: ...


class _NoEvents:
    def publish(self, kind: str, run_id: int | None = None, **data: Any) -> None:
        return None


@dataclass
class _Slot:
    """One proposal slot of a round; design-space slots with the same parent and island merge into one with
    ``n`` > 1 (one Optuna study asked ``n`` times)."""

    slot: int
    island: int
    kind: str
    parent: ProgramView
    second: ProgramView | None
    n: int = 1


class SearchEngine:
    def __init__(self, workload_dir: str | Path, store: Store, evaluator: Evaluator,
                 sources: Sequence[ProposalSource], config: SearchConfig | None = None,
                 events: EventSink | None = None, *,
                 executor: Executor | None = None, run_id: int | None = None, resume: bool = True,
                 embed: Any = None, start: StartPoint | None = None) -> None:
        self.workload_dir = str(workload_dir)
        self.start_point = start  # a fast-path result to start from instead of the workload's baseline
        self.store = store
        self.evaluator = evaluator
        self.config = config or SearchConfig()
        self.events: EventSink = events if events is not None else _NoEvents()
        self.sources: list[ProposalSource] = list(sources)
        self.human: HumanSource = next((s for s in self.sources if isinstance(s, HumanSource)), None) \
            or HumanSource()
        if self.human not in self.sources:
            self.sources.append(self.human)
        self.gate = ApprovalGate(self.config.gate)
        self.executor: Executor = executor or PoolExecutor(evaluator, self.config.slots)
        self.badge: Badge = badge_of(evaluator)
        self._requested_run_id = run_id
        self._resume = resume
        spec = self.config.models.novelty
        if embed is None and self.config.novelty.use_embeddings and spec is not None:
            embed = openai_embedder(replace(spec.llm_config(), embedding_model=spec.name))  # the novelty role's model
        self.novelty = NoveltyFilter(self.config.novelty, embed)
        self.run_id: int | None = None
        self.population = Population()
        self.archive = Archive()
        self.phase = PhaseController(self.config.phases)
        self.ledger: Ledger | None = None
        self.state = "new"
        self.reason = ""
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._thread: threading.Thread | None = None
        self._setup_done = False
        self._baseline_code = ""  # the baseline root's code, read and checked at set-up
        self._initial_codes: list[str] = []  # the further starting programs' code (config.initial_programs)
        self._island_files = islands_mod.IslandFiles()  # the islands' own programs and prompts, read at set-up
        self._owner = False  # this engine holds the store's owner lock
        self._gen_done = 0
        self._migrations: list[dict[str, Any]] = []
        self._meta_summary = ""
        self._wall_before = 0.0
        self._budget: BudgetTracker | None = None  # made with the run, in _setup
        self._llm_out = False
        self._empty_rounds = 0  # rounds in a row that proposed nothing new
        self._nothing_new = ""  # why the search ends for want of anything new to propose ("" while it has some)
        self._proposal_info: dict[int, tuple[int, int]] = {}  # waiting proposal id -> (generation, island)
        self._admitted = 0  # the last generation whose proposals are stored
        self._ready: list[int] = []  # program ids approved and stored, waiting for evaluation
        self._rerun_of: dict[int, list[int]] = {}  # program id -> interrupted evaluation ids
        self._best: float | None = None
        self._build_failed: list[ProgramView] = []  # LLM programs of this round that did not compile
        self._to_diagnose: list[int] = []  # programs evaluated since the last round's end (diagnosis.py)
        self.counters = {"duplicates_skipped": 0, "novelty_rejected": 0, "reruns": 0, "remeasures": 0}
        # Re-measures (search/remeasure.py): the verdict per program, the tag of each one in flight (evaluation id ->
        # its stored tag), and the migrations not made because a migrant's advantage did not hold.
        self._verdicts: dict[int, remeasure.Verdict] = {}
        self._remeasuring: dict[int, dict[str, Any]] = {}
        self._refused: list[dict[str, Any]] = []
        self._can_remeasure = remeasure.supported(self.badge)
        self._budget_noted = False  # the log said once that the evaluation budget left a promotion unchecked

    @property
    def _rid(self) -> int:
        """The run's id, once set-up has found or created it (every store call after set-up uses this)."""
        if self.run_id is None:
            raise CucoError("the search has no run yet: call run() or start() first")
        return self.run_id

    # ------------------------------------------------------------------------------------------- control
    def run(self) -> SearchSummary:
        """Run until the budget is spent or ``stop()`` is called; returns the summary. Raises what broke the
        run (after recording the run as stopped)."""
        try:
            self._setup()
            self._loop()
        except BaseException as exc:
            self.error = exc
            self._finish("stopped", f"error: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.executor.shutdown(wait=True)
            self._disown()
        return self.summary()

    def start(self) -> threading.Thread:
        """Run in a worker thread and return it at once (errors end up in ``self.error``)."""
        if self._thread is not None and self._thread.is_alive():
            raise BadInput("this search is already running; stop() it first")
        # Set up here, not in the thread: run_id exists when this returns (a dashboard binds to it) and a bad
        # workload, or a database another search owns, is reported in the calling cell.
        try:
            self._setup()
        except BaseException:
            self._disown()
            raise

        def target() -> None:
            try:
                self.run()
            except BaseException as exc:  # noqa: BLE001 - kept for the notebook; the run is marked stopped
                log.error("search stopped by an error: %s", exc)

        self._thread = threading.Thread(target=target, name="cuco-search", daemon=True)
        self._thread.start()
        return self._thread

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a started search; True when it has ended."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def pause(self) -> None:
        """Stop proposing and starting evaluations after those in flight; ``resume()`` continues."""
        self._running.clear()
        self.gate.wake()

    def resume(self) -> None:
        self._running.set()
        self.gate.wake()

    def stop(self) -> None:
        """End the run after the evaluations in flight are committed (resume later from the store)."""
        self._stop.set()
        self._running.set()
        self.gate.wake()

    def submit_human(self, parent_id: int, *, code: str | None = None, edits: str | None = None, name: str = "",
                     rationale: str = "", tags: Sequence[str] = ()) -> None:
        """Queue a person's edit of program ``parent_id`` (the whole code, or SEARCH/REPLACE edits)."""
        self.human.submit(HumanEdit(parent_id, code=code, edits=edits, name=name, rationale=rationale,
                                    tags=list(tags)))
        self.gate.wake()

    @property
    def generation(self) -> int:
        """Generations finished so far."""
        return self._gen_done

    @property
    def budget(self) -> BudgetTracker:
        """The run's budget tracker; it exists once the search is set up (run() or start())."""
        if self._budget is None:
            raise CucoError("the search is not set up yet: its budget is tracked once run() or start() set it up")
        return self._budget

    # ------------------------------------------------------------------------------------------- events
    def _emit(self, kind: str, **data: Any) -> None:
        try:
            self.events.publish(kind, run_id=self.run_id, **data)
        except CucoError as exc:  # a malformed event is our bug; it must not kill a search
            log.error("event %s not published: %s", kind, exc)

    def _log(self, message: str, level: str = "info") -> None:
        log.log(logging.WARNING if level == "warning" else logging.INFO, message)
        self._emit("log", message=message, level=level, source="search")

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state = state
        if self.run_id is not None:
            self.store.set_run_state(self.run_id, state)
        self._emit("run_state", state=state, reason=reason)

    # ------------------------------------------------------------------------------------------- setup
    def _setup(self) -> None:
        if self._setup_done:
            return
        cfg = self.config
        self.workload = load_workload(self.workload_dir)
        # Checked like a --from file before anything is stored or evaluated (start_from checked that one).
        self._baseline_code = read_baseline(self.workload) if self.start_point is None else self.start_point.code
        self._initial_codes = [read_initial(path) for path in cfg.initial_programs]
        self._island_files = islands_mod.read_files(cfg.islands)
        if not self._owner:
            self.store.acquire_owner("search")  # before reading what to resume: it must not change under us
            self._owner = True
        self.run_id = self._find_or_create_run()
        self._load_state()
        # The ledger's budget is per run: what earlier sessions of this run spent counts too.
        self.ledger = Ledger(self.store, self.run_id, cfg.budget.llm_dollars, budget_tokens=cfg.budget.llm_tokens,
                             prices=cfg.models.prices() or None, per_run=True)
        for s in self.sources:
            if isinstance(s, BindsEngine):
                s.bind(self)
        if isinstance(self.evaluator, BindsLedger):
            self.evaluator.bind_ledger(self.ledger)  # evaluation-side LLM calls count against the same budget
        llm, meta_model = self._role_client("meta")
        stored = self.store.get_meta(self._rid, "meta_summary") or {}  # the scratchpad carries across resumes
        self.meta = MetaSummarizer(cfg.meta, llm, workload=self.workload.name, backend=cfg.backend,
                                   world_size=cfg.world_size, model=meta_model,
                                   scratchpad=str(stored.get("scratchpad", "")),
                                   last_generation=int(stored.get("generation") or 0))
        self.diagnoser = diagnosis.Diagnoser(cfg.diagnosis, *self._role_client("diagnosis"), self.store, self._rid,
                                             workload=self.workload.name, backend=cfg.backend,
                                             world_size=cfg.world_size)
        judge_llm, judge_model = self._role_client("novelty_judge")
        if cfg.novelty.llm_judge and judge_llm is not None:  # off by default; asked about near-duplicates only
            self.novelty.judge = NoveltyJudge(cfg.novelty, judge_llm, judge_model, self.store, self._rid,
                                              workload=self.workload.name, backend=cfg.backend,
                                              world_size=cfg.world_size)
        self._budget = BudgetTracker(cfg.budget, self.store, self.run_id, wall_used_before=self._wall_before)
        if not self.population.roots():
            self._add_roots()
        self._add_initial_programs()
        self._add_island_programs()
        self._restore_pending()
        self._setup_done = True

    def _role_client(self, role: str) -> tuple[Any, str | None]:
        """(the LLM client of a side role, its configured model's name) from the first LLM source; (None, None)
        without one."""
        for s in self.sources:
            if isinstance(s, ServesRoles):
                return s.role_client(role)
            if isinstance(s, HasClient):
                return (s.meta_client or s.client) if role == "meta" else s.client, None
        return None, None

    def _disown(self) -> None:
        if self._owner:
            self._owner = False
            self.store.release_owner()

    def _find_or_create_run(self) -> int:
        cfg = self.config
        if self._requested_run_id is not None:
            self.store.run(self._requested_run_id)  # NotFound names it
            return self._requested_run_id
        start_sha = self.start_point.sha if self.start_point is not None else None
        if self._resume:
            for run in reversed(self.store.runs()):
                c = run["config"]
                if run["workload"] == self.workload.name and c.get("backend") == cfg.backend \
                        and c.get("world_size") == cfg.world_size and c.get("seed") == cfg.seed \
                        and c.get("start_from") == start_sha \
                        and c.get("initial_programs", []) == cfg.initial_programs \
                        and (c.get("islands") or {}).get("initial_programs", []) == cfg.islands.initial_programs:
                    self._log(f"resuming run {run['id']} of {self.workload.name} from {self.store.path}")
                    return int(run["id"])
        return self.store.create_run(workload=self.workload.name,
                                     config={**cfg.to_dict(), "workload_dir": self.workload_dir,
                                             "start_from": start_sha},
                                     seed=cfg.seed, badge=self.badge)

    def _load_state(self) -> None:
        rid = self._rid
        assert rid is not None
        interrupted = self.store.mark_interrupted(rid)
        st = self.store.get_meta(rid, "state", {}) or {}
        self._gen_done = int(st.get("generation_done", 0))
        self._migrations = list(st.get("migrations", []))
        self._refused = list(st.get("refused_migrations", []))
        recorded = st.get("topology")
        now = [list(e) for e in islands_mod.edges(self.config.islands)]
        if recorded is not None and recorded != now:
            self._log(f"resume: the islands' topology changed ({len(recorded)} edge(s) before, {len(now)} now); the "
                      "migrations made stand, the next ones follow the new edges", "warning")
        self._meta_summary = str(st.get("meta_summary", ""))
        self._wall_before = float(st.get("wall_s", 0.0))
        # Spent under the budget this session has: still spent; a raised budget lets the LLM propose again.
        budget = [self.config.budget.llm_dollars, self.config.budget.llm_tokens]
        self._llm_out = bool(st.get("llm_exhausted", False)) and st.get("llm_budget", budget) == budget
        self._empty_rounds = int(st.get("empty_rounds", 0))
        if st.get("phase"):
            self.phase = PhaseController(self.config.phases, PhaseState(**st["phase"]))
        self.population = Population.from_store(self.store, rid, self._migrations)
        for pid, d in diagnosis.load(self.store, rid).items():
            if pid in self.population.programs:
                self.population.programs[pid].diagnosis = d.text
        # Evaluated in a round whose end was not stored: diagnosed when that round is finished.
        self._to_diagnose = [p.id for p in self.population.all() if p.generation > self._gen_done]
        self.population.island_api = self.config.islands.api_map()
        self.population.seeded_islands = self.config.islands.seeded()
        # The verdicts of the re-measures stored so far: the evaluations are the record (their requests say why).
        self._verdicts = remeasure.rebuild(self.store.evaluations(run_id=rid), self.population)
        self.population.held_back = {pid for pid, v in self._verdicts.items() if not v.held}
        self.archive = Archive.rebuild(self.population)
        best = self.population.best()
        self._best = best.fitness if best else None
        rnd = self.store.get_meta(rid, "round")
        # A file from before the "round" metadata: its newest program tells the round it was in.
        self._admitted = int(rnd["generation"]) if rnd else max((p.generation for p in self.population.all()),
                                                                default=0)
        if interrupted:
            evs = {e["id"]: e for e in self.store.evaluations(run_id=rid)}
            for eid in interrupted:
                pid = evs[eid]["program_id"]
                self._rerun_of.setdefault(pid, []).append(eid)
            reruns = self.store.get_meta(rid, "reruns", []) or []
            reruns.append({"at": time.time(), "interrupted": interrupted})
            self.store.put_meta(rid, "reruns", reruns)
            self._log(f"resume: {len(interrupted)} evaluation(s) were in flight when the run stopped "
                      f"({', '.join(map(str, interrupted))}); marked interrupted, their programs run again",
                      "warning")
        # Programs stored but never evaluated (in flight at a kill, or waiting): evaluate them first.
        self._ready = [p.id for p in self.population.unevaluated()]

    def _add_roots(self) -> None:
        wl, cfg = self.workload, self.config
        rid = self._rid
        try:
            seed_path = wl.seed_for(cfg.backend)
        except BadInput as exc:
            seed_path = None
            # expected for an imported workload (one host-NCCL seed): information, not a warning on stderr
            self._log(f"{exc}: speed-ups come from the evaluator's own seed measurement only")
        roots: list[tuple[str, str, str]] = []
        if seed_path is not None:
            roots.append(("seed", f"seed ({cfg.backend})", seed_path.read_text(encoding="utf-8")))
        baseline_parent = None
        roots.append(("baseline", self.start_point.name if self.start_point else "baseline", self._baseline_code))
        if self.start_point is not None:
            # The fast path's stages first (once: a kill may have come after them), the result's parent last.
            stages = [p.id for p in self.population.all() if LINEAGE_TAG in p.tags]
            baseline_parent = stages[-1] if stages else add_lineage(self.store, rid, self.start_point)
        stored = {p.source for p in self.population.all()}
        for source, name, code in roots:
            if source in stored:
                continue  # a kill came between storing the seed and the baseline
            knobs, cell = cell_of(code, cfg.backend, cfg.cell_features)
            pid = self.store.add_program(run_id=rid, code=code,
                                         parent_id=baseline_parent if source == "baseline" else None,
                                         source=source, name=name,
                                         rationale=f"the workload's {name}", tags=[source], knobs=knobs, cell=cell,
                                         island=0, generation=0)
            self.population.add_row(self.store.program(pid))
            self._ready.append(pid)

    def _add_initial_programs(self) -> None:
        """The user's further starting programs (SearchConfig.initial_programs) at generation 0, one island each
        in turn after the baseline's; a program already in the run (a kill came between two) is not added again."""
        cfg = self.config
        for i, (path, code) in enumerate(zip(cfg.initial_programs, self._initial_codes, strict=True)):
            if self.store.find_program_by_hash(self._rid, code_hash(code)) is not None:
                continue
            knobs, cell = cell_of(code, cfg.backend, cfg.cell_features)
            name = Path(path).name
            pid = self.store.add_program(run_id=self._rid, code=code, parent_id=None, source="human",
                                         name=f"initial program ({name})", rationale=f"a starting program: {name}",
                                         tags=[INITIAL_TAG], knobs=knobs, cell=cell,
                                         island=(i + 1) % cfg.islands.islands, generation=0)
            self.population.add_row(self.store.program(pid))
            self._ready.append(pid)

    def _add_island_programs(self) -> None:
        """The islands' own starting programs (IslandConfig.initial_programs) at generation 0, each on its island.
        A program the run already has (a kill came between two, or the same file starts two islands) is not added
        again; on another island it becomes a member there too, every session anew (the config says so)."""
        cfg = self.config
        for island, files in sorted(self._island_files.programs.items()):
            for path, code in files:
                row = self.store.find_program_by_hash(self._rid, code_hash(code))
                if row is not None:
                    if int(row.get("island") or 0) != island:
                        self.population.migrate(row["id"], island)
                    continue
                knobs, cell = cell_of(code, cfg.backend, cfg.cell_features)
                name = Path(path).name
                pid = self.store.add_program(run_id=self._rid, code=code, parent_id=None, source="human",
                                             name=f"island {island} start ({name})",
                                             rationale=f"a starting program of island {island}: {name}",
                                             tags=[INITIAL_TAG, f"island:{island}"], knobs=knobs, cell=cell,
                                             island=island, generation=0)
                self.population.add_row(self.store.program(pid))
                self._ready.append(pid)

    def _restore_pending(self) -> None:
        """Proposals waiting when the run stopped go back to the gate, with the labels they were stored with."""
        labels = (self.store.get_meta(self._rid, "round") or {}).get("pending", {})
        for row in self.store.proposals(self._rid, "pending"):
            prop = Proposal(name=row["name"], rationale=row["rationale"], diff=row["diff"], tags=row["tags"],
                            source=row["source"], parent_id=row["parent_id"], code=row["code"],
                            second_parent_id=row.get("second_parent_id"))
            parent = self.population.get(prop.parent_id)
            # Without a label (a file from before them): the next generation, on the parent's island.
            generation, island = labels.get(str(row["id"]), (self._gen_done + 1, parent.island if parent else 0))
            self._proposal_info[row["id"]] = (int(generation), int(island))
            self.gate.restore(row["id"], prop)

    # ------------------------------------------------------------------------------------------- loop
    def _loop(self) -> None:
        cfg = self.config
        self._set_state("running")
        # Leftovers of an interrupted session: finish the round they belong to first.
        self._drain_gate()
        self._evaluate_ready()
        self._close_rounds()
        while True:
            if self._stop.is_set():
                return self._finish("stopped", "stopped by request")
            self._hold_if_paused()
            if self._stop.is_set():
                continue
            hard = self.budget.hard_stop() or target.reached(self.population, cfg.target_ratio)
            if hard:
                return self._finish("finished", hard)
            self._collect_human()
            self._drain_gate()
            if self._ready:
                self._evaluate_ready()
                continue
            why = self._round_blocked()
            if why is None:
                self._round(self._gen_done + 1)
                continue
            if why in ("budget", "nothing new") and self.gate.waiting() == 0 and self.human.waiting() == 0:
                return self._finish("finished", self._budget_reason() if why == "budget" else self._nothing_new)
            self.gate.wait(cfg.idle_poll_s)

    def _hold_if_paused(self) -> None:
        """Block the engine thread (only) while paused; in-flight evaluations were already committed."""
        if self._running.is_set():
            return
        self._set_state("paused")
        while not self._running.wait(self.config.idle_poll_s):
            pass
        if not self._stop.is_set():
            self._set_state("running")

    def _budget_reason(self) -> str:
        r = self.budget.exhausted(self._gen_done)
        if r:
            return r
        return "LLM budget spent and no offline source to go on with" if self._llm_out else "budget reached"

    def _round_blocked(self) -> str | None:
        """Why no new round may start now: "budget", "nothing new" (the last rounds proposed nothing new: the
        search ends unless a person's decision or edit brings something), "pending" (manual gate full) or None."""
        if self.budget.exhausted(self._gen_done):
            return "budget"
        if self._nothing_new:
            return "nothing new"
        if self.config.budget.llm_dollars is not None and not self._llm_out \
                and self.budget.dollars_used() >= self.config.budget.llm_dollars:
            self._llm_out = True
            self._log(f"LLM budget spent (${self.budget.dollars_used():.4f}); no more LLM proposals", "warning")
        if not self._kinds():
            return "budget"
        if self.gate.mode == "manual" and self.gate.waiting() >= self.config.max_pending:
            return "pending"
        return None

    def _finish(self, state: str, reason: str) -> None:
        self.reason = reason
        if self.run_id is not None:
            try:
                self._save_state()
            except Exception as exc:  # noqa: BLE001 - the state row is best effort at the very end
                log.error("could not save the run state: %s", exc)
            self._set_state(state, reason)
            self._log(f"search {state}: {reason}")

    # ------------------------------------------------------------------------------------------- rounds
    def _kinds(self) -> set[str]:
        kinds: set[str] = set()
        for s in self.sources:
            kinds.update(s.kinds)
        if self._llm_out:
            kinds -= set(LLM_KINDS)
        return kinds

    def _source_for(self, kind: str) -> ProposalSource:
        return next(s for s in self.sources if kind in s.kinds)

    def _round(self, generation: int) -> None:
        cfg = self.config
        rng = random.Random(f"{cfg.seed}/{generation}")
        settings = self.phase.settings
        sel = SelectionConfig(**{**asdict(cfg.selection), "method": settings.selection})
        kinds = self._kinds()
        counts = self.population.child_counts()
        slots: list[_Slot] = []
        for slot in range(cfg.proposals_per_generation):
            island = islands_mod.island_for_slot(slot, cfg.islands)
            kind = settings.draw_kind(rng, kinds)
            if kind is None:
                break
            parent = select_parent(self.population.island_members(island), self.population.island_start(island),
                                   sel, rng, counts)
            second = None
            if kind == "crossover":
                second = self._second_parent(parent, island, rng)
                if second is None:
                    kind = "diff" if "diff" in kinds else next(iter(sorted(kinds - {"crossover"})), None)
                    if kind is None:
                        continue
            counts[parent.id] = counts.get(parent.id, 0) + 1
            slots.append(_Slot(slot, island, kind, parent, second))
        # Design-space slots with the same parent share one study: asked together, constant-liar spreads them.
        groups: list[_Slot] = []
        for s in slots:
            if s.kind == "design_space":
                same = next((g for g in groups if g.kind == "design_space" and g.parent.id == s.parent.id
                             and g.island == s.island), None)
                if same is not None:
                    same.n += 1
                    continue
            groups.append(s)
        programs_before = len(self.population)
        proposals: list[tuple[Proposal, int]] = []
        for g in groups:
            ctx = self._context(generation, g, rng)
            source = self._source_for(g.kind)
            try:
                got = source.propose(ctx)
            except LLMBudgetExceeded as exc:
                self._llm_out = True
                self._log(f"LLM budget spent: {exc}", "warning")
                continue
            proposals.extend((p, g.island) for p in got[:g.n])
        gated = self._admit(proposals, generation, round_generation=generation)
        self._drain_gate()
        self._evaluate_ready()
        self._repair_builds(generation, rng)
        if gated == 0 and len(self.population) == programs_before:
            self._note_empty_round(generation, knobs_only=all(g.kind == "design_space" for g in groups))
        else:
            self._empty_rounds = 0
        self._end_round(generation)

    def _note_empty_round(self, generation: int, *, knobs_only: bool) -> None:
        """A round that proposed nothing new (no source had anything, or all of it repeated the run's programs):
        with only design-space slots the knob space is spent -- the source falls back to every unseen point of
        it, so an empty answer is exhaustion, not bad luck -- and the search ends at once; with LLM slots it ends
        after ``max_empty_generations`` such rounds in a row."""
        self._empty_rounds += 1
        if knobs_only:
            self._nothing_new = (f"design space exhausted: generation {generation} found no knob setting the run "
                                 "has not tried")
        elif self._empty_rounds >= self.config.max_empty_generations:
            self._nothing_new = (f"nothing new to propose: {self._empty_rounds} generations in a row (to "
                                 f"generation {generation}) brought no program the run does not have")
        if self._nothing_new:
            self._log(self._nothing_new, "warning")

    def _repair_builds(self, generation: int, rng: random.Random) -> None:
        """LLM candidates of this round that did not compile go back to their source once, with the compiler's
        errors (LLMSource.repair_build); the repairs are admitted and evaluated in the same round."""
        failed, self._build_failed = self._build_failed, []
        batch: list[tuple[Proposal, int]] = []
        for p in failed:
            source = next((s for s in self.sources if isinstance(s, RepairsBuilds)), None)
            parent = self.population.get(p.parent_id)
            if source is None or parent is None or self._llm_out:
                continue
            slot = _Slot(0, p.island, "diff", parent, self.population.get(p.second_parent_id))
            try:
                got = source.repair_build(self._context(generation, slot, rng), p)
            except LLMBudgetExceeded as exc:
                self._llm_out = True
                self._log(f"LLM budget spent: {exc}", "warning")
                break
            batch.extend((prop, p.island) for prop in got)
        if batch:
            self._admit(batch, generation, round_generation=generation)
            self._drain_gate()
            self._evaluate_ready()

    def _second_parent(self, parent: ProgramView, island: int, rng: random.Random) -> ProgramView | None:
        pool = [p for p in self.population.top(self.config.selection.crossover_pool)
                if p.id != parent.id and p.island != island]
        pool += [self.population.programs[i] for i in self.archive.cells().values()
                 if i != parent.id and i not in {p.id for p in pool}]
        pool = [p for p in pool if p.code != parent.code]
        return pool[rng.randrange(len(pool))] if pool else None

    def _context(self, generation: int, g: _Slot, rng: random.Random) -> ProposalContext:
        cfg = self.config
        parent = g.parent
        insp = [] if g.kind == "design_space" else self.archive.inspirations(
            self.population, rng, cfg.inspirations, exclude=[parent.id], prefer_not_island=g.island)
        return ProposalContext(
            run_id=self._rid, generation=generation, island=g.island, parent=parent,
            population=self.population, phase=self.phase.settings, rng=rng, kind=g.kind,
            second_parent=g.second, inspirations=insp,
            failures=self.population.failures(cfg.failures_in_prompt), meta_summary=self._meta_summary,
            seed=cfg.seed, parallel=cfg.slots, n=g.n,
            system_prompt=islands_mod.system_prompt(g.island, cfg.islands,
                                                    self._island_files.prompts.get(g.island, "")))

    def _collect_human(self) -> None:
        if self.human.waiting() == 0:
            return
        roots = self.population.roots()
        best = self.population.best() or (roots[0] if roots else None)
        if best is None:
            return
        ctx = ProposalContext(run_id=self._rid, generation=self._gen_done + 1, island=best.island, parent=best,
                              population=self.population, phase=self.phase.settings,
                              rng=random.Random(0), kind="human", seed=self.config.seed)
        batch = []
        for prop in self.human.propose(ctx):
            parent = self.population.get(prop.parent_id)
            batch.append((prop, parent.island if parent else 0))
        self._admit(batch, self._gen_done + 1, round_generation=self._admitted)
        for err in self.human.errors:
            self._log(err, "warning")

    def _admit(self, batch: list[tuple[Proposal, int]], generation: int, *, round_generation: int) -> int:
        """Dedupe, store, filter for novelty, and hand to the gate: a batch of (proposal, island), all labelled
        ``generation``. The batch is stored in one transaction with the run's "round" metadata (the last round
        whose proposals are stored, and the labels of every proposal waiting for the gate). Returns how many
        went to the gate."""
        seen: set[str] = set()
        checked: list[tuple[Proposal, int, NoveltyVerdict]] = []
        for prop, island in batch:
            h = code_hash(prop.code)
            if h in seen or self.store.find_program_by_hash(self._rid, h) is not None:
                self.counters["duplicates_skipped"] += 1
                log.debug("proposal %r repeats a program already in the run; skipped", prop.name)
                continue
            seen.add(h)
            _, cell = cell_of(prop.code, self.config.backend, self.config.cell_features)
            # Checked before the transaction: an embedding call must not hold the store's readers up.
            checked.append((prop, island, self.novelty.check(prop.code, cell, prop.source, self.population)))
        stored: list[tuple[int, Proposal, NoveltyVerdict]] = []
        with self.store.transaction():
            for prop, island, verdict in checked:
                pid = self.store.add_proposal(run_id=self._rid, parent_id=prop.parent_id, source=prop.source,
                                              name=prop.name, rationale=prop.rationale, diff=prop.diff,
                                              code=prop.code, tags=prop.tags + verdict.tags(),
                                              second_parent_id=prop.second_parent_id)
                if prop.meta.get("model"):
                    record_proposal_llm(self.store, self._rid, pid, prop.meta)
                if verdict.novel:
                    self._proposal_info[pid] = (generation, island)
                else:
                    self.store.decide(pid, "rejected", by="novelty", note=verdict.reason())
                stored.append((pid, prop, verdict))
            self.store.put_meta(self._rid, "round", {
                "generation": round_generation,
                "pending": {str(k): list(v) for k, v in self._proposal_info.items()}})
        self._admitted = round_generation
        for pid, prop, verdict in stored:
            self._emit("proposal", proposal_id=pid, name=prop.name, source=prop.source, parent_id=prop.parent_id,
                       second_parent_id=prop.second_parent_id, tags=prop.tags, rationale=prop.rationale)
            if verdict.novel:
                self.gate.submit(pid, prop)
            else:
                self.counters["novelty_rejected"] += 1
                self._emit("decision", proposal_id=pid, decision="rejected", by="novelty", note=verdict.reason())
        return sum(verdict.novel for _, _, verdict in stored)

    def _drain_gate(self) -> None:
        for d, prop in self.gate.drain():
            generation, island = self._proposal_info.pop(d.proposal_id, (self._gen_done + 1, 0))
            if d.decision == "rejected":
                self.store.decide(d.proposal_id, "rejected", by=d.by, note=d.note)
                self._emit("decision", proposal_id=d.proposal_id, decision="rejected", by=d.by, note=d.note)
                continue
            code = d.code if d.decision == "edited" and d.code is not None else prop.code
            # The program and the decision are stored together: a kill leaves the proposal pending, or decided
            # with its program.
            with self.store.transaction():
                existing = self.store.find_program_by_hash(self._rid, code_hash(code))
                if existing is not None:  # the same code as a program we have (two proposals that agree)
                    program_id = existing["id"]
                else:
                    knobs, cell = cell_of(code, self.config.backend, self.config.cell_features)
                    tags = list(prop.tags) + (["edited"] if d.decision == "edited" else [])
                    program_id = self.store.add_program(
                        run_id=self._rid, code=code, parent_id=prop.parent_id, source=prop.source,
                        name=prop.name, rationale=prop.rationale, tags=tags, knobs=knobs, cell=cell,
                        island=island, generation=generation, second_parent_id=prop.second_parent_id)
                self.store.decide(d.proposal_id, d.decision, by=d.by, note=d.note,
                                  code=d.code if d.decision == "edited" else None, program_id=program_id)
            if self.population.get(program_id) is None:
                self.population.add_row(self.store.program(program_id))
                self._ready.append(program_id)
                self._empty_rounds, self._nothing_new = 0, ""  # something new: its children may be too
            self._emit("decision", proposal_id=d.proposal_id, decision=d.decision, by=d.by, note=d.note,
                       program_id=program_id)

    # ------------------------------------------------------------------------------------------- evaluation
    def _request(self, p: ProgramView, purpose: str | None = None) -> EvalRequest:
        """The request that evaluates ``p``; with a ``purpose`` ("migrant", "best"), the one that measures it again
        before that promotion: its own request seed (fresh inputs and noise), the seed measured beside it."""
        cfg = self.config
        parent = self.population.get(p.parent_id)
        req = EvalRequest(candidate_code=p.code, workload_dir=self.workload_dir, params=dict(cfg.params),
                          world_size=cfg.world_size, backend=cfg.backend,
                          parent_code=parent.code if parent is not None else None, iters=cfg.iters,
                          seed=cfg.seed, timeline=cfg.timeline == "every", label=f"program {p.id}: {p.name}")
        if purpose is None:
            return req
        attempt = sum(1 for e in self.store.evaluations(program_id=p.id)
                      if (e.get("request") or {}).get(remeasure.REQUEST_KEY))
        # No timeline: the first evaluation recorded it, and its profiling would only add time.
        return replace(req, seed=remeasure.request_seed(cfg.seed, p.id, attempt), measure_seed=True,
                       iters=cfg.remeasure.iters or cfg.iters, timeline=False,
                       label=f"{req.label} (re-measured before {WHY[purpose]})")

    def _evaluate_ready(self) -> None:
        """Evaluate every ready program: up to ``slots`` at once, builds of the rest started ahead; then check the
        run's best (`_confirm_best`)."""
        if not self._ready:
            self._confirm_best()  # a resume may find a best that was never measured again
            return
        todo = [self.population.programs[i] for i in self._ready]
        self._ready = []
        # The seed first and alone: every ratio is relative to it.
        seeds = [p for p in todo if p.source == "seed"]
        rest = [p for p in todo if p.source != "seed"]
        for batch in ([seeds, rest] if seeds else [rest]):
            self._evaluate(batch)
        self._confirm_best()

    def _evaluate(self, programs: list[ProgramView], purpose: str | None = None) -> None:
        """Evaluate ``programs`` (with a ``purpose``: measure them again before that promotion)."""
        if not programs:
            return
        slots = self.executor.slots
        requests = [self._request(p, purpose) for p in programs]
        tags = {p.id: remeasure.tag(purpose, p.fitness) for p in programs} if purpose else {}
        for r in requests[slots:]:
            self.executor.prebuild(r)
        queue = list(zip(programs, requests))
        inflight: dict[cf.Future[EvalResult], tuple[ProgramView, int]] = {}
        while queue or inflight:
            if not inflight:
                self._hold_if_paused()  # a pause also holds the rest of a round's batch
            while queue and len(inflight) < slots and self._running.is_set() and not self._hard_stopping():
                p, req = queue.pop(0)
                inflight.update([self._submit(p, req, tags.get(p.id))])
            if not inflight:
                break  # hard stop: what was not started stays unevaluated (it runs on resume)
            done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: inflight[f][1]):
                p, eid = inflight.pop(fut)
                self._commit(p, eid, fut)
        # Programs not started because of a stop go back to the ready list (evaluated on resume); a re-measure not
        # started is asked for again when its promotion comes up again.
        if purpose is None:
            self._ready.extend(p.id for p, _ in queue)

    def _hard_stopping(self) -> bool:
        return self._stop.is_set() or self.budget.hard_stop() is not None

    def _submit(self, p: ProgramView, req: EvalRequest, tag: dict[str, Any] | None = None
                ) -> tuple[cf.Future[EvalResult], tuple[ProgramView, int]]:
        stored = req.__dict__.copy()
        if p.id in self._rerun_of:
            stored["rerun_of"] = self._rerun_of[p.id]
        if tag is not None:
            stored[remeasure.REQUEST_KEY] = tag  # a resume finds the verdict from this
        eid = self.store.start_evaluation(p.id, world_size=req.world_size, backend=req.backend, badge=self.badge,
                                          request=stored)
        if p.id in self._rerun_of:
            self.counters["reruns"] += 1
            self._log(f"re-running program {p.id} (evaluation(s) {self._rerun_of[p.id]} were interrupted) as "
                      f"evaluation {eid}", "warning")
        if tag is not None:
            self._remeasuring[eid] = tag
            self.counters["remeasures"] += 1
        self._emit("evaluation_started", evaluation_id=eid, program_id=p.id, world_size=req.world_size,
                   backend=req.backend, badge=self.badge, name=p.name, source=p.source,
                   **({"remeasure": tag["purpose"]} if tag else {}))

        def progress(d: dict[str, Any]) -> None:
            data = {k: v for k, v in d.items() if k not in ("evaluation_id", "program_id")}
            self._emit("evaluation_progress", evaluation_id=eid, program_id=p.id, **data)

        return self.executor.submit(req, progress), (p, eid)

    def _commit(self, p: ProgramView, eid: int, fut: cf.Future[EvalResult]) -> None:
        try:
            result: EvalResult = fut.result()
        except Exception as exc:  # noqa: BLE001 - an evaluator bug is recorded as an error result
            result = error_result(self._request(p), exc, self.badge)
        d = result.to_dict()
        self.store.finish_evaluation(eid, d)
        self._rerun_of.pop(p.id, None)
        tag = self._remeasuring.pop(eid, None)
        p = self.population.set_result(p.id, d, eid)
        if p.source == "seed":
            # Fitness of anything scored before the seed's number was known is recomputed against it.
            for q in self.population.all():
                if q.result is not None and q.id != p.id:
                    self.population.set_result(q.id, q.result, q.evaluation_id)
        if tag is None:
            self.archive.update(p, self.population)
            self._to_diagnose.append(p.id)  # a re-measure teaches the diagnosis nothing the first one did not
            if p.source in ("llm_diff", "llm_full", "llm_crossover") and repair.is_build_failure(d):
                self._build_failed.append(p)
        self._emit("evaluation_finished", evaluation_id=eid, program_id=p.id, level_reached=result.level_reached,
                   verdict=result.verdict, median_ms=result.median_ms if result.passed else None,
                   speedup=result.speedup if result.passed else None, badge=result.badge, reason=result.reason,
                   flagged=result.flagged, oracle=result.oracle, **({"remeasure": tag["purpose"]} if tag else {}))
        if tag is not None:
            self._record_verdict(p, eid, tag)
        self._announce_best(p, result, eid)

    def _record_verdict(self, p: ProgramView, eid: int, tag: dict[str, Any]) -> None:
        v = remeasure.judge(p, purpose=str(tag["purpose"]), claimed=tag.get("claimed"), evaluation_id=eid)
        self._verdicts[p.id] = v
        if v.held:
            self.population.held_back.discard(p.id)
        else:
            self.population.held_back.add(p.id)
        # Its fitness is the re-measured one now, maybe lower: the cells' elites are chosen again.
        self.archive = Archive.rebuild(self.population)
        self._log(f"program {p.id} ({p.name}) measured again before {WHY[v.purpose]} (evaluation {eid}): "
                  f"{v.reason}: " + ("its advantage holds" if v.held else "its advantage does not hold, not promoted"),
                  "info" if v.held else "warning")

    def _awaits_check(self, p: ProgramView) -> bool:
        """Whether announcing ``p`` as the run's best waits for it to be measured again (search/remeasure.py)."""
        return self.config.remeasure.bests and self._can_remeasure and remeasure.claims(p) \
            and p.id not in self._verdicts

    def _announce_best(self, p: ProgramView, result: EvalResult, eid: int) -> None:
        """The new_best event when ``p`` beats every program announced before (and, where its claim over the seed
        is to be checked, once it held)."""
        if p.fitness is None or p.source == "seed" or p.id in self.population.held_back \
                or (self._best is not None and p.fitness <= self._best) or self._awaits_check(p):
            return
        previous = self.population.best([q for q in self.population.scored() if q.id != p.id])
        self._best = p.fitness
        self._emit("new_best", program_id=p.id, median_ms=result.median_ms, speedup=p.fitness,
                   evaluation_id=eid,
                   previous_median_ms=(previous.result or {}).get("median_ms") if previous else None)

    def _evaluations_left(self) -> bool:
        """Whether the run may start one more evaluation the search chose itself (a re-measure)."""
        if self._stop.is_set() or self._hard_stopping():
            return False
        limit = self.config.budget.evaluations
        if limit is not None and self.budget.evaluations_used() >= limit:
            if not self._budget_noted:
                self._budget_noted = True
                self._log(f"evaluation budget spent ({limit}): programs that claim to beat the seed are no longer "
                          "measured again, so they are not promoted", "warning")
            return False
        return True

    def _confirm_best(self) -> None:
        """Measure the run's best again while it claims to beat the seed and has not been checked; one that does
        not hold is held back, and the next best is checked in turn."""
        if not (self.config.remeasure.bests and self._can_remeasure):
            return
        while True:
            b = self.population.best()
            if b is None or not self._awaits_check(b) or not self._evaluations_left():
                return
            self._evaluate([b], "best")
            if b.id not in self._verdicts:
                return  # not started (a pause turned into a stop): asked again when the run goes on

    def _check_migrants(self, moves: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
        """The moves whose migrant may go: it must beat the seed, measured again beside it (once per program); a
        move whose migrant does not, or whose advantage does not hold, is dropped and recorded."""
        if not moves or not (self.config.remeasure.migrants and self._can_remeasure):
            return moves
        todo: list[ProgramView] = []
        for m in moves:
            p = self.population.programs[m["program_id"]]
            if remeasure.claims(p) and p.id not in self._verdicts and p.id not in {q.id for q in todo}:
                todo.append(p)  # a migrant that does not claim to beat the seed has no advantage to check
        if todo and self._evaluations_left():
            self._evaluate(todo, "migrant")
        kept: list[dict[str, Any]] = []
        for m in moves:
            p = self.population.programs[m["program_id"]]
            v = self._verdicts.get(p.id)
            if v is not None and not v.held:
                why = f"its advantage did not hold when measured again ({v.reason})"
            elif not remeasure.claims(p):
                # A migrant seeds another island with what it does better than the seed; one that does not beat
                # it has nothing to carry (and its measured lead over its island's others may be luck).
                why = f"it does not beat the seed ({p.fitness:.3f}x)" if p.fitness is not None else "no fitness"
            elif v is None:
                why = "it could not be measured again (evaluation budget spent or the run stopping)"
            else:
                kept.append(m)
                continue
            self._refused.append({**m, "reason": why})
            # Keeping home a migrant that never claimed to beat the seed is the rule at work, not news.
            self._log(f"migration after generation {generation}: program {p.id} island {m['from']}->{m['to']} not "
                      f"copied: {why}", "warning" if remeasure.claims(p) or v is not None else "info")
        return kept

    # ------------------------------------------------------------------------------------------- round end
    def _close_rounds(self) -> None:
        """After a resume: finish the bookkeeping of rounds whose proposals are stored but whose end was not."""
        for g in range(self._gen_done + 1, self._admitted + 1):
            self._end_round(g)

    def _end_round(self, generation: int) -> None:
        cfg = self.config
        self.diagnoser.diagnose(self.population, self._to_diagnose, generation)  # before the meta-summary reads
        self._to_diagnose = []
        if islands_mod.due(generation, cfg.islands):
            moves = self._check_migrants(islands_mod.plan(self.population, generation, cfg.islands), generation)
            islands_mod.apply(self.population, moves)
            self._confirm_best()  # a migrant held back may have been the best
            self._migrations.extend(moves)
            if moves:
                self._log(f"migration after generation {generation}: " + ", ".join(
                    f"program {m['program_id']} island {m['from']}->{m['to']}" for m in moves))
        best = self.population.best()
        switched = self.phase.end_generation(generation, best.fitness if best else None)
        if switched:
            self._log(f"phase -> {self.phase.state.phase} after generation {generation} ({switched})")
        if self.meta.due(generation):
            m = self.meta.summarize(self.population, generation)
            self._meta_summary = m.text
            self.store.put_meta(self._rid, "meta_summary", {"generation": generation, **m.to_dict()})
        self._gen_done = generation
        self._save_state()

    def _save_state(self) -> None:
        # One row, written at once: a kill leaves either the previous round's state or this one's.
        self.store.put_meta(self._rid, "state", {
            "generation_done": self._gen_done, "phase": self.phase.state.to_dict(),
            "migrations": self._migrations, "meta_summary": self._meta_summary,
            "topology": [list(e) for e in islands_mod.edges(self.config.islands)],
            "refused_migrations": self._refused,
            "remeasures": [v.to_dict() for v in self._verdicts.values()],
            "wall_s": self._budget.wall_used() if self._budget is not None else self._wall_before,
            "llm_exhausted": self._llm_out, "empty_rounds": self._empty_rounds,
            "llm_budget": [self.config.budget.llm_dollars, self.config.budget.llm_tokens],
            "archive": self.archive.cells()})

    # ------------------------------------------------------------------------------------------- summary
    def summary(self) -> SearchSummary:
        best = self.population.best()
        evs = self.store.evaluations(run_id=self.run_id) if self.run_id is not None else []
        return SearchSummary(
            run_id=self.run_id or 0, state=self.state, reason=self.reason, generations=self._gen_done,
            programs=len(self.population), evaluations=len(evs), best_program_id=best.id if best else None,
            best_speedup=best.fitness if best else None,
            best_median_ms=(best.result or {}).get("median_ms") if best else None, badge=self.badge,
            duplicates_skipped=self.counters["duplicates_skipped"],
            novelty_rejected=self.counters["novelty_rejected"], reruns=self.counters["reruns"],
            prebuilds=self.executor.prebuilds,
            llm_dollars=self.store.llm_dollars(self.run_id) if self.run_id is not None else 0.0,
            remeasures=sum(1 for e in evs if (e.get("request") or {}).get(remeasure.REQUEST_KEY)),
            held_back=len(self.population.held_back))
