"""The fast path's loop: a host-collective seed -> a correct device-initiated candidate with EVOLVE blocks.

    analyze -> Stage A (devComm + declared scratch windows through the runtime helpers; host collectives kept)
            -> Stage B (host collectives replaced by LSA device code, or by GIN puts and signals)
            (or, with `single_stage`, one stage "single" that does both in one rewrite, checked as Stage B is)
            -> annotate (EVOLVE blocks + knob block; accepted only if stripping the markers gives back the
               input byte for byte, else a deterministic fallback)

Each stage loops: rewrite (LLM) -> L0 -> L1 (nvcc) -> L2 (1 and 2 ranks through an Evaluator, when a GPU is
present) -> judge (LLM diagnosis of a failure; the HARNESS decides pass/fail, never the judge) -> retry with
the history of failed attempts, up to `max_attempts`. The rewrite and the judge are model roles of their own:
`FastPath(..., judge_llm=...)` sends the judge's calls to another client (a cheaper model), through the same
ledger; `FastPathConfig.rewrite_model` / `judge_model` record the names in the run's config.
Without a GPU a stage stops after L1 and says so ("no GPU: L2 not evaluated"). GIN output goes through L2 like
LSA output wherever the backend can run it: under `symm` (runtime/gin_compat.h serves GIN's puts, signals, counters
and flushes over the ranks' shared windows on one GPU), which checks correctness, not network speed. A GIN source
that builds for `nccl` only (`// cuco: backends=nccl`) is built and reported "unavailable to run" (it needs RDMA
NICs), which is not a failure.

Every step is an object a notebook can hold: `FastPath.analyze()` gives the AnalysisReport, each stage a
StageOutcome with its Attempts (proposal text, code, diff, L0, build log, evaluation, diagnosis, verdict). In
manual mode (`FastPathConfig(manual=True)`) the loop pauses before evaluating each attempt (`fp.pending`) and
continues on `approve()`, `reject(note)` or `edit(code)`. LLM calls go through a Ledger (a hard dollar
budget); proposals, decisions, programs and evaluations go to the Store when one is given.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.api import LEVELS, EvalRequest, EvalResult, Evaluator, Level, Verdict, checked_against
from cuco_kit.evaluate.build import BuildConfig, build, for_workload, supported_backends
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.events import EventSink
from cuco_kit.fastpath import steps
from cuco_kit.fastpath.sanitizer import SanitizerReport, has_illegal_access, sanitize
from cuco_kit.fastpath.steps import L0Check
from cuco_kit.llm import Ledger, LedgeredClient, LLMClient, LLMError, LLMTruncated
from cuco_kit.prompts import load, render
from cuco_kit.prompts.nccl_api import device_api_excerpts
from cuco_kit.source import markers
from cuco_kit.source.analysis import AnalysisReport, analyze
from cuco_kit.source.patch import extract_code_block, unified_diff
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

BACKENDS = ("lsa", "gin")
STAGES = ("A", "B", "single", "annotate")
PURPOSES = {"A": "fastpath.stage_a", "B": "fastpath.stage_b", "single": "fastpath.single_stage",
            "annotate": "fastpath.annotate", "judge": "fastpath.judge"}
# Stages whose output has no host communication left (their L0 contract is Stage B's).
REPLACING_STAGES = ("B", "single")
NO_GPU = "no GPU: L2 not evaluated"
GIN_UNAVAILABLE = ("GIN: built for nccl only; unavailable to run here (needs RDMA NICs; a source that also builds "
                   "for symm runs on one GPU through gin_compat.h) - not a failure")

# Verdicts of one attempt.
#   pass          every level that can run here passed (L2 at every planned world size)
#   pass_l1       passed L0 and L1; L2 not evaluated (no GPU / no evaluator): said plainly, never "pass"
#   compile_only  GIN built for nccl only: L0 and L1 passed; running needs NICs this machine lacks (not a failure)
#   fail          the harness rejected it at L0, L1 or L2
#   error         the LLM answer was unusable (truncated, no code block) or the LLM failed
#   rejected      a person rejected it before evaluation
GOOD_VERDICTS = ("pass", "pass_l1", "compile_only")
# An attempt's verdict as the store's evaluation verdict (what is not a cascade verdict is "error").
_STORED_VERDICTS: dict[str, Verdict] = {"pass": "pass", "fail": "fail", "error": "error", "pass_l1": "unavailable",
                                        "compile_only": "unavailable"}


# ------------------------------------------------------------------------------------------------- records

@dataclass
class FastPathConfig:
    backend: str = "lsa"  # "lsa" | "gin"
    max_attempts: int = 3  # per stage (Stage A, Stage B)
    annotate_attempts: int = 1  # LLM annotation tries before the deterministic fallback
    manual: bool = False  # pause before evaluating each attempt (approve / reject / edit)
    temperature: float | None = 0.2
    max_tokens: int | None = None
    judge: bool = True  # ask the LLM for a diagnosis of each failed attempt
    # One rewrite from the seed straight to device-initiated code ("single"), instead of Stage A then Stage B.
    single_stage: bool = False
    # The model roles, as names for the run's record (None: the client's configured model). The clients are what
    # FastPath is given: `llm` rewrites, `judge_llm` (default: `llm`) diagnoses; `cuco fastpath` builds them.
    rewrite_model: str | None = None
    judge_model: str | None = None
    budget_dollars: float | None = 5.0  # hard LLM budget when FastPath wraps the client in a Ledger itself
    budget_tokens: int | None = None  # tokens of calls at unknown price (None: the ledger's default)
    gpu: bool | None = None  # None: detect with nvidia-smi; False: never run L2; True: assume one is present
    l2_worlds: tuple[int, ...] = (1, 2)
    size_preset: str | None = "small"  # workload size preset for L2 (None: the workload's defaults)
    params: dict[str, int] = field(default_factory=dict)  # explicit overrides (win over the preset)
    l2_iters: int = 3
    l2_trials: int = 3
    build_config: BuildConfig | None = None  # None: its defaults
    cache_dir: str | None = None  # build cache; None: the evaluator's default (~/.cache/cuco/builds)
    sanitize_timeout_s: float = 300.0
    log_tail_chars: int = 2500
    history_diff_chars: int = 3000
    run_id: int | None = None  # store run to write into; None: a new run is created

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise BadInput(f"fast path backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.max_attempts < 1:
            raise BadInput(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.annotate_attempts < 0:
            raise BadInput(f"annotate_attempts must be >= 0, got {self.annotate_attempts}")


@dataclass
class Attempt:
    stage: str
    proposal_text: str
    code: str | None
    diff: str
    l0: L0Check | None
    build_log: str
    eval_result: list[EvalResult] | None
    diagnosis: str
    verdict: str
    number: int = 0
    source: str = "llm"  # llm | human | fallback
    level: str = ""  # where it stopped: LLM, L0, L1, L2
    reason: str = ""
    builds: dict[str, bool] = field(default_factory=dict)  # backend -> built
    so_paths: dict[str, str] = field(default_factory=dict)
    sanitizer: SanitizerReport | None = None
    note: str = ""  # a person's note (reject) or what the harness adds
    proposal_id: int | None = None
    program_id: int | None = None
    llm_model: str | None = None
    fixture: bool = False  # the answer came from a labelled test fixture

    @property
    def ok(self) -> bool:
        return self.verdict in GOOD_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("l0", "eval_result", "sanitizer")}
        d["l0"] = self.l0.to_dict() if self.l0 else None
        d["eval_result"] = [r.to_dict() for r in self.eval_result] if self.eval_result is not None else None
        d["sanitizer"] = self.sanitizer.to_dict() if self.sanitizer else None
        return d


@dataclass
class StageOutcome:
    """status: passed | passed_l1 (no GPU) | compile_only (GIN) | failed | llm_error | pending (manual mode,
    waiting for approve/reject/edit) | fallback (annotate: the deterministic annotator was used)."""

    stage: str
    status: str
    code: str  # the stage's output when it succeeded, else its input
    attempts: list[Attempt] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "passed_l1", "compile_only", "fallback")

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "status": self.status, "ok": self.ok, "message": self.message,
                "attempts": [a.to_dict() for a in self.attempts], "code": self.code}


@dataclass
class FastPathResult:
    status: str  # passed | passed_l1 | compile_only | failed | llm_error | pending
    code: str  # the final candidate (annotated when every stage passed), else the last good code
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    message: str = ""
    ledger: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "passed_l1", "compile_only")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "ok": self.ok, "message": self.message, "ledger": self.ledger,
                "stages": {k: v.to_dict() for k, v in self.outcomes.items()}, "code": self.code}


@dataclass
class _Decision:
    kind: str  # approve | reject | edit
    note: str = ""
    code: str = ""  # the edited code (edit only)


# ------------------------------------------------------------------------------------------------ engine

class FastPath:
    """The fast path over one seed. See the module doc; `run()` does every stage."""

    def __init__(self, seed_code: str, workload_dir: str | Path | None, llm: LLMClient,
                 evaluator: Evaluator | None = None, store: Store | None = None,
                 config: FastPathConfig | None = None, events: EventSink | None = None, *,
                 builder: Callable[..., Any] | None = None, seed_name: str = "seed.cu",
                 judge_llm: LLMClient | None = None) -> None:
        if not isinstance(seed_code, str) or not seed_code.strip():
            raise BadInput("the fast path needs the seed's source text")
        self.seed_code = seed_code
        self.seed_name = seed_name
        self.workload_dir = str(workload_dir) if workload_dir is not None else None
        self.config = config or FastPathConfig()
        self.evaluator = evaluator
        self.store = store
        self.events = events
        self._builder = builder
        self.run_id: int | None = self.config.run_id
        if store is not None and self.run_id is None:
            wl = Path(self.workload_dir).name if self.workload_dir else "unknown"
            cfg = {k: v for k, v in asdict(self.config).items() if k != "build_config"}
            self.run_id = store.create_run(workload=wl, config={"fastpath": cfg})
        # Every call goes through a ledger: reuse the caller's, or make one on the store with the budget.
        if isinstance(llm, LedgeredClient):
            self.llm = llm
        else:
            self.llm = LedgeredClient(llm, Ledger(store, self.run_id, self.config.budget_dollars,
                                                  budget_tokens=self.config.budget_tokens))
        self.ledger = self.llm.ledger
        # The judge role: its own client when given (another model), on the same ledger and budget.
        if judge_llm is None:
            self.judge_llm: LedgeredClient = self.llm
        elif isinstance(judge_llm, LedgeredClient):
            self.judge_llm = judge_llm
        else:
            self.judge_llm = LedgeredClient(judge_llm, self.ledger)
        self.report: AnalysisReport | None = None
        self.outcomes: dict[str, StageOutcome] = {}
        # A seed that carries EVOLVE markers (CUCo's unnamed ones are named block_<n>): the stages rewrite the code
        # without them (their outputs may not have markers) and the annotate step places the result's blocks.
        self.seed_blocks = markers.blocks(seed_code)
        self.block_names = markers.naming_note(self.seed_blocks)
        self.current_code = markers.strip_markers(seed_code) if self.seed_blocks else seed_code
        self.pending: Attempt | None = None
        self._gen: Generator[Attempt, _Decision, Any] | None = None
        self._gpu: bool | None = self.config.gpu
        self._program_ids: dict[str, int] = {}
        if store is not None and self.run_id is not None:  # a store always has the run (created above)
            self._program_ids["seed"] = store.add_program(run_id=self.run_id, code=seed_code, parent_id=None,
                                                          source="seed", name=seed_name)

    # -- public steps ------------------------------------------------------------------------------------
    def analyze(self) -> AnalysisReport:
        """The seed's communication analysis."""
        if self.report is None:
            self.report = analyze(self.seed_code, self.seed_name)
            self._log(f"analysis: {len(self.report.collectives)} collective(s), {len(self.report.p2p)} "
                      f"send/recv, {len(self.report.launches)} launch(es)")
        return self.report

    def stage_a(self) -> StageOutcome:
        return self._drive(self._stage_gen("A"))

    def stage_b(self) -> StageOutcome:
        return self._drive(self._stage_gen("B"))

    def single_stage(self) -> StageOutcome:
        """Stage A and Stage B in one rewrite (the seed straight to device-initiated code)."""
        return self._drive(self._stage_gen("single"))

    def annotate(self) -> StageOutcome:
        return self._drive(self._annotate_gen())

    def run(self) -> FastPathResult:
        return self._drive(self._run_gen())

    # -- human decisions (manual mode) --------------------------------------------------------------------
    def approve(self) -> StageOutcome | FastPathResult:
        """Evaluate the pending attempt as proposed and continue."""
        return self._resume(_Decision("approve"))

    def reject(self, note: str = "") -> StageOutcome | FastPathResult:
        """Count the pending attempt as failed, feed `note` back to the model, and continue."""
        return self._resume(_Decision("reject", note=note))

    def edit(self, code: str) -> StageOutcome | FastPathResult:
        """Evaluate `code` (a person's edit of the pending attempt) instead, as a human proposal."""
        if not isinstance(code, str) or not code.strip():
            raise BadInput("edit(code): pass the edited source text")
        return self._resume(_Decision("edit", code=code))

    # -- driving ------------------------------------------------------------------------------------------
    def _drive(self, gen: Generator[Attempt, _Decision, Any]) -> Any:
        if self._gen is not None:
            raise CucoError("an attempt is pending a decision: call approve(), reject(note) or edit(code) first")
        return self._step(gen, None)

    def _resume(self, decision: _Decision) -> Any:
        if self._gen is None or self.pending is None:
            raise CucoError("nothing is pending: approve/reject/edit apply in manual mode after a stage paused")
        gen, self._gen, self.pending = self._gen, None, None
        return self._step(gen, decision)

    def _step(self, gen: Generator[Attempt, _Decision, Any], decision: _Decision | None) -> Any:
        try:
            attempt = gen.send(decision) if decision is not None else next(gen)
            while not self.config.manual:
                attempt = gen.send(_Decision("approve"))
        except StopIteration as stop:
            return stop.value
        self.pending, self._gen = attempt, gen
        return self._snapshot(attempt)

    def _snapshot(self, attempt: Attempt) -> Any:
        stage = attempt.stage
        prev = self.outcomes.get(stage)
        attempts = list(prev.attempts) if prev else []
        return StageOutcome(stage, "pending", self.current_code, attempts + [attempt],
                            f"stage {stage}: attempt {attempt.number} waits for approve(), reject(note) or "
                            "edit(code)")

    # -- generators -----------------------------------------------------------------------------------------
    def _run_gen(self) -> Generator[Attempt, _Decision, FastPathResult]:
        feats = self.analyze().features()
        if not feats["uses_host_comm"]:
            self._log("the seed has no host NCCL communication: Stage A and B have nothing to replace")
        if self.config.single_stage:
            b = yield from self._stage_gen("single")
            if not b.ok:
                return self._result(b.status, f"the single stage did not pass: {b.message}")
        else:
            a = yield from self._stage_gen("A")
            if not a.ok:
                return self._result(a.status, f"Stage A did not pass: {a.message}")
            b = yield from self._stage_gen("B")
            if not b.ok:
                return self._result(b.status, f"Stage B did not pass: {b.message}")
        n = yield from self._annotate_gen()
        if not n.ok:
            return self._result("failed", f"annotate failed: {n.message}")
        status = b.status if b.status in ("passed_l1", "compile_only") else "passed"
        msg = {"passed": "every stage passed (L2 at " + ", ".join(map(str, self.config.l2_worlds)) + " rank(s))",
               "passed_l1": f"every stage passed up to L1; {NO_GPU}",
               "compile_only": f"every stage passed up to L1; {GIN_UNAVAILABLE}"}[status]
        return self._result(status, msg)

    def _result(self, status: str, message: str) -> FastPathResult:
        return FastPathResult(status, self.current_code, dict(self.outcomes), message, self.ledger.totals())

    def _stage_gen(self, stage: str) -> Generator[Attempt, _Decision, StageOutcome]:
        self.analyze()
        cfg = self.config
        stage_input = self.current_code
        outcome = StageOutcome(stage, "failed", stage_input)
        self.outcomes[stage] = outcome
        history: list[Attempt] = []
        for number in range(1, cfg.max_attempts + 1):
            attempt = self._propose(stage, stage_input, history, number)
            if attempt.verdict == "error" and attempt.level == "LLM" and attempt.code is None and \
                    attempt.note == "fatal":
                outcome.attempts.append(attempt)
                outcome.status, outcome.message = "llm_error", attempt.reason
                self._log(f"stage {stage}: {attempt.reason}", level="error")
                return outcome
            if attempt.code is not None:
                decision = yield attempt
                attempt = self._apply_decision(attempt, decision, stage_input)
                if attempt.verdict != "rejected":
                    self._evaluate_stage(attempt, stage_input)
            outcome.attempts.append(attempt)
            self._store_outcome(attempt, stage)
            if attempt.ok:
                self.current_code = attempt.code or stage_input
                outcome.code = self.current_code
                outcome.status = {"pass": "passed", "pass_l1": "passed_l1", "compile_only": "compile_only"}[
                    attempt.verdict]
                outcome.message = attempt.reason
                if self.store is not None and attempt.program_id is not None:
                    self._program_ids[stage] = attempt.program_id
                self._log(f"stage {stage}: attempt {number} {attempt.verdict}: {attempt.reason}")
                return outcome
            if attempt.verdict == "fail" and cfg.judge:
                attempt.diagnosis = self._judge(attempt, stage_input)
            self._log(f"stage {stage}: attempt {number} {attempt.verdict} at {attempt.level}: {attempt.reason}",
                      level="warning")
            history.append(attempt)
        outcome.message = (f"no attempt passed in {cfg.max_attempts}; last: "
                           f"{history[-1].level} {history[-1].reason}" if history else "no attempt")
        return outcome

    def _annotate_gen(self) -> Generator[Attempt, _Decision, StageOutcome]:
        cfg = self.config
        original = self.current_code
        outcome = StageOutcome("annotate", "failed", original)
        self.outcomes["annotate"] = outcome
        history: list[Attempt] = []
        for number in range(1, cfg.annotate_attempts + 1):
            attempt = self._propose("annotate", original, history, number)
            if attempt.code is not None:
                decision = yield attempt
                attempt = self._apply_decision(attempt, decision, original)
                if attempt.verdict != "rejected":
                    self._judge_annotation(attempt, original)
            outcome.attempts.append(attempt)
            self._store_outcome(attempt, "annotate")
            if attempt.ok:
                self.current_code = outcome.code = attempt.code or original
                outcome.status, outcome.message = "passed", attempt.reason
                return outcome
            history.append(attempt)
            if attempt.note == "fatal":
                break
        annotated, notes = steps.fallback_annotate(original)
        check = steps.check_annotation(annotated, original)
        why = "; ".join(notes)
        fb = Attempt("annotate", "(deterministic fallback annotator)", annotated,
                     _diff(original, annotated), check, "", None, "",
                     "pass" if check.ok else "fail", number=len(outcome.attempts) + 1, source="fallback",
                     level="L0", reason=("fallback annotation accepted: " + ", ".join(check.features.get(
                         "blocks", []))) if check.ok else "fallback annotation rejected: " + "; ".join(
                         check.reasons), note=why)
        outcome.attempts.append(fb)
        self._store_outcome(fb, "annotate")
        if check.ok:
            self.current_code = outcome.code = annotated
            outcome.status = "fallback"
            outcome.message = ("the LLM annotation was not accepted; the deterministic fallback wrapped " +
                               ", ".join(check.features.get("blocks", [])) + (f" ({why})" if why else ""))
        else:
            outcome.message = fb.reason
        return outcome

    # -- one attempt --------------------------------------------------------------------------------------
    def _messages(self, stage: str, code: str, history: list[Attempt]) -> list[dict[str, Any]]:
        hist = self._history_text(history)
        if stage == "annotate":
            user = render("fastpath_annotate", code=code, history=hist)
        else:
            backend = "lsa" if stage == "A" else self.config.backend
            try:
                ctx = device_api_excerpts(backend)
            except CucoError as exc:
                ctx = f"(NCCL API context unavailable: {exc})"
            name = "fastpath_stage_a" if stage == "A" else f"fastpath_stage_b_{self.config.backend}"
            try:
                summary = analyze(code, self.seed_name).summary()
            except BadInput as exc:
                summary = f"(analysis failed: {exc})"
            user = render(name, analysis=summary, api_context=ctx, cookbook=load("cookbook"), code=code,
                          history=hist)
            if stage == "single":
                # Stage B's rules, on the seed itself, after what Stage A would have added first.
                user = render(f"fastpath_single_stage_{self.config.backend}", stage_b=user)
        return [{"role": "system", "content": load("fastpath_system")}, {"role": "user", "content": user}]

    def _history_text(self, history: list[Attempt]) -> str:
        if not history:
            return ""
        parts = ["\n## Previous attempts that failed (do not repeat them)\n"]
        n = self.config.log_tail_chars
        for a in history:
            parts.append(f"### Attempt {a.number} ({a.source}): {a.verdict} at {a.level}\n{a.reason}")
            if a.note and a.note != "fatal":
                parts.append(f"Note: {a.note}")
            if a.diagnosis:
                parts.append(f"Diagnosis: {a.diagnosis}")
            if a.sanitizer is not None and a.sanitizer.message:
                parts.append(f"Sanitizer: {a.sanitizer.message}")
            if a.build_log and a.level == "L1":
                parts.append(f"Compiler log (tail):\n```\n{steps.tail(a.build_log, n)}\n```")
            if a.eval_result:
                for r in a.eval_result:
                    if r.verdict == "fail":
                        logs = "\n".join(f"[{k}] {steps.tail(v, n // 2)}" for k, v in r.logs.items() if v)
                        parts.append(f"Run ({r.provenance.get('world_size', '?')} rank(s)): {r.reason}\n```\n"
                                     f"{steps.tail(logs, n)}\n```")
        return "\n".join(parts) + "\n"

    def _propose(self, stage: str, code: str, history: list[Attempt], number: int) -> Attempt:
        msgs = self._messages(stage, code, history)
        try:
            c = self.llm.complete(msgs, purpose=PURPOSES[stage], temperature=self.config.temperature,
                                  max_tokens=self.config.max_tokens)
        except LLMTruncated as exc:
            return Attempt(stage, exc.completion.text, None, "", None, "", None, "", "error", number=number,
                           level="LLM", reason="the answer was cut at the token limit (truncated); nothing was "
                           "evaluated", note="Your previous answer was cut off: answer with the complete file "
                           "and at most two sentences, nothing else.", llm_model=exc.completion.model,
                           fixture=exc.completion.fixture)
        except LLMError as exc:
            return Attempt(stage, "", None, "", None, "", None, "", "error", number=number, level="LLM",
                           reason=f"LLM call failed: {exc}", note="fatal")
        new = extract_code_block(c.text)
        if new is None:
            return Attempt(stage, c.text, None, "", None, "", None, "", "error", number=number, level="LLM",
                           reason="the answer has no ```cuda code block", note="Answer with the complete file in "
                           "one ```cuda fenced block.", llm_model=c.model, fixture=c.fixture)
        if code.endswith("\n") and not new.endswith("\n"):
            new += "\n"
        att = Attempt(stage, c.text, new, _diff(code, new), None, "", None, "", "pending", number=number,
                      llm_model=c.model, fixture=c.fixture)
        self._store_proposal(att)
        return att

    def _apply_decision(self, attempt: Attempt, decision: _Decision | None, stage_input: str) -> Attempt:
        d = decision or _Decision("approve")
        by = "auto" if not self.config.manual else "human"
        if d.kind == "reject":
            attempt.verdict, attempt.level = "rejected", "human"
            attempt.reason = "rejected by a person before evaluation"
            attempt.note = d.note or "(no note)"
            attempt.diagnosis = f"A person rejected this proposal: {attempt.note}"
            self._decide(attempt, "rejected", by, d.note)
        elif d.kind == "edit":
            attempt.code = d.code if d.code.endswith("\n") or not stage_input.endswith("\n") else d.code + "\n"
            attempt.source = "human"
            attempt.diff = _diff(stage_input, attempt.code)
            self._decide(attempt, "edited", by, d.note, code=attempt.code)
        else:
            self._decide(attempt, "approved", by, d.note)
        return attempt

    def _evaluate_stage(self, attempt: Attempt, stage_input: str) -> None:
        cfg = self.config
        code = attempt.code or ""
        contract = "B" if attempt.stage in REPLACING_STAGES else attempt.stage
        attempt.l0 = steps.check_stage_output(code, contract, cfg.backend, self.report)
        if not attempt.l0.ok:
            attempt.verdict, attempt.level = "fail", "L0"
            attempt.reason = "L0: " + "; ".join(attempt.l0.reasons)
            return
        targets = self._build_backends(code, attempt)
        logs = []
        for be in targets:
            r = self._build(code, be)
            attempt.builds[be] = bool(r.ok)
            logs.append(f"### build for {be}: {'ok' if r.ok else 'FAILED'} ({r.seconds:.1f} s"
                        f"{', cached' if r.cached else ''})\n{r.log}")
            if r.ok and r.so_path is not None:
                attempt.so_paths[be] = str(r.so_path)
            if not r.ok:
                attempt.build_log = "\n".join(logs)
                attempt.verdict, attempt.level = "fail", "L1"
                attempt.reason = f"L1: nvcc failed for backend {be} (compiler log kept)"
                return
        attempt.build_log = "\n".join(logs)
        attempt.level = "L1"
        if attempt.stage in REPLACING_STAGES and cfg.backend == "gin" and not gin_runnable(targets):
            attempt.verdict, attempt.reason = "compile_only", GIN_UNAVAILABLE
            return
        if self.evaluator is None or self.workload_dir is None:
            attempt.verdict = "pass_l1"
            missing = "no evaluator" if self.evaluator is None else "no workload"
            attempt.reason = f"L1 passed; L2 not evaluated ({missing})"
            return
        if not self._has_gpu():
            attempt.verdict, attempt.reason = "pass_l1", f"L1 passed; {NO_GPU}"
            return
        self._run_l2(attempt, code, targets, self.evaluator)

    def _build_backends(self, code: str, attempt: Attempt) -> list[str]:
        try:
            # host NCCL calls build for symm too (runtime/symm_nccl/nccl.h): Stage A is measured at the world
            # its Stage B runs in
            return list(supported_backends(code))
        except BadInput:
            return ["nccl"]

    def _build(self, code: str, backend: str) -> Any:
        if self._builder is not None:
            return self._builder(code, backend, self.config.build_config, self.config.cache_dir)
        cfg = self.config.build_config
        if self.workload_dir is not None:
            cfg = for_workload(cfg, self.workload_dir)
        return build(code, backend, cfg, self.config.cache_dir)

    def _has_gpu(self) -> bool:
        if self._gpu is None:
            self._gpu = gpu_present()
        return self._gpu

    def _l2_params(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.config.size_preset and self.workload_dir:
            wl = load_workload(self.workload_dir)
            out.update(wl.size_presets.get(self.config.size_preset, {}))
        out.update(self.config.params)
        return out

    def _run_l2(self, attempt: Attempt, code: str, built: list[str], evaluator: Evaluator) -> None:
        cfg = self.config
        backend = "symm" if "symm" in built else "nccl"
        params = self._l2_params()
        results: list[EvalResult] = []
        unavailable: list[str] = []
        for world in cfg.l2_worlds:
            req = EvalRequest(candidate_code=code, workload_dir=self.workload_dir or "", params=params,
                              world_size=world, backend=backend, iters=cfg.l2_iters, warmup=1,
                              trials=cfg.l2_trials, measure_seed=False,
                              label=f"fastpath stage {attempt.stage} attempt {attempt.number}")
            res = evaluator.evaluate(req)
            res.provenance.setdefault("world_size", world)
            res.provenance.setdefault("backend", backend)
            results.append(res)
            self._store_evaluation(attempt, req, res)
            if res.verdict == "unavailable":
                unavailable.append(f"{world} rank(s): {res.reason}")
                continue
            if res.verdict != "pass":
                attempt.eval_result = results
                attempt.verdict = "fail"
                attempt.level = "L2" if res.level_reached in ("L2", "L3") else res.level_reached
                attempt.reason = (f"L2 at {world} rank(s) under {backend}: {res.verdict}: {res.reason}"
                                  + (f" (outputs {checked_against(res.oracle)})" if res.oracle else ""))
                if has_illegal_access(res.logs) or has_illegal_access(res.reason):
                    attempt.sanitizer = sanitize(evaluator, req, attempt.so_paths.get(backend),
                                                 timeout_s=cfg.sanitize_timeout_s)
                    attempt.reason += f" [illegal memory access; {attempt.sanitizer.message}]"
                return
        attempt.eval_result = results
        attempt.level = "L2"
        ran = [r for r in results if r.verdict == "pass"]
        if not ran:
            attempt.verdict = "pass_l1"
            attempt.reason = "L1 passed; L2 unavailable here: " + "; ".join(unavailable)
            return
        attempt.verdict = "pass"
        worlds = ", ".join(str(r.provenance.get("world_size")) for r in ran)
        attempt.reason = f"L2 passed at {worlds} rank(s) under {backend}, outputs {checked_against(ran[0].oracle)}" + (
            f" (not run: {'; '.join(unavailable)})" if unavailable else "")

    def _judge_annotation(self, attempt: Attempt, original: str) -> None:
        attempt.l0 = steps.check_annotation(attempt.code or "", original)
        attempt.level = "L0"
        if attempt.l0.ok:
            attempt.verdict = "pass"
            attempt.reason = ("annotation accepted: markers only (stripping them gives back the input byte for "
                              "byte); blocks " + ", ".join(attempt.l0.features.get("blocks", [])) +
                              "; L1/L2 carry over from Stage B because only comment lines were added")
        else:
            attempt.verdict = "fail"
            attempt.reason = "L0: " + "; ".join(attempt.l0.reasons)

    def _judge(self, attempt: Attempt, stage_input: str) -> str:
        logs: list[str] = []
        n = self.config.log_tail_chars
        if attempt.l0 is not None and not attempt.l0.ok:
            logs.append("L0:\n" + "\n".join(attempt.l0.reasons))
        if attempt.build_log and attempt.level == "L1":
            logs.append(steps.tail(attempt.build_log, n))
        for r in attempt.eval_result or []:
            for k, v in r.logs.items():
                if v:
                    logs.append(f"[{k}, {r.provenance.get('world_size', '?')} rank(s)] {steps.tail(v, n // 2)}")
        if attempt.sanitizer is not None:
            logs.append(f"[compute-sanitizer] {attempt.sanitizer.message}\n{steps.tail(attempt.sanitizer.log, n)}")
        user = render("fastpath_judge", stage=attempt.stage, level=attempt.level, reason=attempt.reason,
                      logs=steps.tail("\n".join(logs) or "(none)", 2 * n),
                      diff=steps.tail(attempt.diff, self.config.history_diff_chars) or "(no change)")
        try:
            c = self.judge_llm.complete([{"role": "user", "content": user}], purpose=PURPOSES["judge"],
                                  temperature=0.0, max_tokens=self.config.max_tokens)
        except LLMError as exc:
            return f"(no diagnosis: the judge call failed: {exc})"
        return c.text.strip()

    # -- store and events -----------------------------------------------------------------------------------
    def _log(self, message: str, level: str = "info") -> None:
        if self.events is not None:
            self.events.publish("log", self.run_id, message=message, level=level, source="fastpath")

    def _parent_program(self, stage: str) -> int | None:
        order = {"A": ["seed"], "B": ["A", "seed"], "single": ["seed"], "annotate": ["B", "single", "A", "seed"]}[
            stage]
        return next((self._program_ids[k] for k in order if k in self._program_ids), None)

    def _store_proposal(self, attempt: Attempt) -> None:
        if self.store is None or self.run_id is None:
            return
        attempt.proposal_id = self.store.add_proposal(
            run_id=self.run_id, parent_id=self._parent_program(attempt.stage), source="fastpath",
            name=f"fastpath {attempt.stage} #{attempt.number}", rationale=attempt.proposal_text[:4000],
            diff=attempt.diff, code=attempt.code or "", tags=[f"stage:{attempt.stage}",
                                                             f"backend:{self.config.backend}"])
        if self.events is not None:
            self.events.publish("proposal", self.run_id, proposal_id=attempt.proposal_id,
                                name=f"fastpath {attempt.stage} #{attempt.number}", source="fastpath",
                                parent_id=self._parent_program(attempt.stage))

    def _decide(self, attempt: Attempt, decision: str, by: str, note: str, code: str | None = None) -> None:
        if self.store is not None and attempt.proposal_id is not None:
            self.store.decide(attempt.proposal_id, decision, by=by, note=note, code=code)
        if self.events is not None:
            self.events.publish("decision", self.run_id, proposal_id=attempt.proposal_id, decision=decision,
                                by=by, note=note)

    def _program(self, attempt: Attempt) -> int | None:
        if self.store is None or self.run_id is None or attempt.code is None or attempt.verdict == "rejected":
            return None
        if attempt.program_id is None:
            source = "human" if attempt.source == "human" else "fastpath"
            attempt.program_id = self.store.add_program(
                run_id=self.run_id, code=attempt.code, parent_id=self._parent_program(attempt.stage),
                source=source, name=f"fastpath {attempt.stage} #{attempt.number}",
                rationale=attempt.reason[:2000], tags=[f"stage:{attempt.stage}", f"source:{attempt.source}"])
            if attempt.proposal_id is not None:
                self.store.link_program(attempt.proposal_id, attempt.program_id)
        return attempt.program_id

    def _store_evaluation(self, attempt: Attempt, req: EvalRequest, res: EvalResult) -> None:
        pid = self._program(attempt)
        if pid is None or self.store is None:
            return
        eid = self.store.start_evaluation(pid, world_size=req.world_size, backend=req.backend, badge=res.badge,
                                          request=json.loads(req.to_json()))
        self.store.finish_evaluation(eid, res.to_dict())

    def _store_outcome(self, attempt: Attempt, stage: str) -> None:
        """L0/L1 outcomes (and verdicts with no L2 run) as an evaluation row, so failures teach later runs."""
        if self.store is None or attempt.code is None or attempt.eval_result is not None or \
                attempt.verdict in ("rejected", "pending"):
            return
        pid = self._program(attempt)
        if pid is None:
            return
        verdict = _STORED_VERDICTS.get(attempt.verdict, "error")
        level: Level = attempt.level if attempt.level in LEVELS else "L0"
        logs = {"L0": "\n".join(attempt.l0.reasons)} if attempt.l0 is not None else {}
        if attempt.build_log:
            logs["build"] = steps.tail(attempt.build_log, 8000)
        res = EvalResult(level, verdict, attempt.reason, logs=logs,
                         provenance={"fastpath_stage": stage, "attempt": attempt.number})
        backend = "symm" if "symm" in attempt.builds else "nccl"
        eid = self.store.start_evaluation(pid, world_size=1, backend=backend, badge="real",
                                          request={"fastpath": stage, "attempt": attempt.number})
        self.store.finish_evaluation(eid, res.to_dict())


def gin_runnable(backends: list[str] | tuple[str, ...]) -> bool:
    """Whether GIN output built for ``backends`` can run here: under symm it can (gin_compat.h, one GPU); built
    for nccl alone it needs RDMA NICs this kit never assumes."""
    return "symm" in backends


def _diff(old: str, new: str) -> str:
    return unified_diff(old, new, "input", "proposal")
