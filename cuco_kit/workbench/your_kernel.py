"""The user's road from a notebook (``06_your_kernel``): import a program, fast path with a person in the loop,
then a search that starts from the approved result.

Each function is one readable line in a cell and returns plain data plus `Note`s saying where answers and
numbers come from. Smoke runs, and machines with no LLM configured, get the fake OpenAI-compatible server with
FIXTURE answers written for the example program (cuco_kit/importer/examples/allreduce_norm.cu: an all-reduce,
then an RMS normalisation), labelled as fixtures on screen.
"""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.fastpath import FastPath, FastPathConfig
from cuco_kit.importer.session import ImportSession
from cuco_kit.importer.workload_writer import SEED_FILE
from cuco_kit.llm import LLMClient, LLMConfig, OpenAICompatibleClient, fixture_scripts
from cuco_kit.llm.fake_server import Scripted
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.start_point import start_from
from cuco_kit.store import Store
from cuco_kit.workbench import (
    EvaluatorChoice,
    Note,
    llm_configured,
    new_search,
    run_db,
    simulated_evaluator,
    smoke,
)
from cuco_kit.workload import load_workload

EXAMPLES = Path(__file__).resolve().parents[1] / "importer" / "examples"  # programs written for the tests
RESULT_FILE = "fastpath_result.cu"


def example_program() -> Path:
    """The example host program the notebook imports: an all-reduce followed by an RMS normalisation."""
    return EXAMPLES / "allreduce_norm.cu"


def workload_folder(name: str) -> Path:
    """A fresh folder for an imported workload: runs/<name>-<date>-<time>-<pid>/ next to the notebook."""
    d = Path.cwd() / "runs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    d.parent.mkdir(exist_ok=True)
    return d


def search_evaluator(choice: EvaluatorChoice) -> EvaluatorChoice:
    """The evaluator for the search from the result: the GPU when there is one, else the SIMULATED landscape
    (a recorded run of another workload cannot be replayed for yours)."""
    return choice if choice.kind == "gpu" else simulated_evaluator()


def searcher(fp: FastPath, choice: EvaluatorChoice, **kwargs: int) -> Callable[[], tuple[SearchEngine, Store]]:
    """`search_from(fp, choice, ...)` as a callable, for the stepper to call once the fast path has passed."""
    return functools.partial(search_from, fp, choice, **kwargs)


def import_fixtures() -> list[Scripted]:
    """FIXTURE answers to the import prompts: a port that drops a buffer, then (after a note) a correct one; a
    reference."""
    return fixture_scripts.example_import()


def fastpath_fixtures() -> list[Scripted]:
    """FIXTURE answers to the fast path on the example's seed: per stage a first answer and a retry answer, and a
    judge answer for any failed attempt."""
    return fixture_scripts.example_fastpath()


def llm_for(script: list[Scripted]) -> tuple[LLMClient, Note]:
    """The LLM for a step: a configured model, or (smoke runs, nothing configured) the fake server with
    `script`."""
    if smoke.enabled() or not llm_configured():
        client, server = smoke.fake_llm_for_smoke(script, max_retries=0)
        why = "smoke run" if smoke.enabled() else "no LLM configured (set OPENAI_API_KEY or OPENAI_BASE_URL)"
        return client, Note(f"{why}: the LLM is a local fake server on {server.base_url} answering with FIXTURE "
                            "answers written for the example program, not a live model", "fixture")
    cfg = LLMConfig()
    return OpenAICompatibleClient(cfg), Note(f"LLM: {cfg.model} at {cfg.base_url}", "info")


def import_session(program: str | Path, workload_dir: str | Path) -> tuple[ImportSession, Note]:
    """An ImportSession over `program` writing into `workload_dir`, with the LLM for port and reference."""
    llm, note = llm_for(import_fixtures())
    return ImportSession(program, workload_dir, llm=llm), note


def reviews_missing(*, port: bool, reference: bool, run_again: str) -> Note | None:
    """None once the port and the reference are approved; else one line naming what to approve and which cell
    to run again (Run All goes past the review points: a cell below them must not act on an unreviewed folder)."""
    missing = [what for what, ok in (("the LLM's port (section 3)", port), ("the torch reference (section 4)",
                                                                            reference)) if not ok]
    if not missing:
        return None
    return Note(f"waiting for your review: approve {' and '.join(missing)} above, then run {run_again} again",
                "info")


def seed_l2(session: ImportSession, choice: EvaluatorChoice) -> tuple[list[EvalResult], Note]:
    """The seed against the approved reference at the small preset on 1 rank (nccl): the gate before the fast
    path. Only a real GPU evaluates it; elsewhere nothing runs and the note says so."""
    if choice.kind != "gpu":
        return [], Note("no GPU here: the seed's L2 against the reference is not evaluated (on a GPU machine it "
                        "must pass before the fast path starts)", "info")
    wl = load_workload(session.directory)
    res = choice.evaluator.evaluate(EvalRequest(
        candidate_code=(session.directory / SEED_FILE).read_text(encoding="utf-8"),
        workload_dir=str(session.directory), params=dict(wl.size_presets["small"]), world_size=1, backend="nccl",
        iters=3, trials=2, measure_seed=False, label="imported seed, L2 gate"))
    ok = res.verdict == "pass"
    return [res], Note(f"seed L2 at 1 rank: {res.verdict} ({res.reason})" + (
        "" if ok else ": review the reference and the port before the fast path"), "real")


def fast_path(session: ImportSession, choice: EvaluatorChoice, *, db: str | Path | None = None,
              max_attempts: int = 3) -> tuple[FastPath, Note]:
    """A manual FastPath over the imported seed: every attempt waits for approve / reject(note) / edit."""
    llm, note = llm_for(fastpath_fixtures())
    store = Store(db or run_db("06_your_kernel"))
    seed = (session.directory / SEED_FILE).read_text(encoding="utf-8")
    cfg = FastPathConfig(manual=True, max_attempts=max_attempts, judge=not smoke.enabled())
    evaluator = choice.evaluator if choice.kind == "gpu" else None
    return FastPath(seed, session.directory, llm, evaluator, store, cfg, seed_name=SEED_FILE), note


def search_from(fp: FastPath, choice: EvaluatorChoice, *, generations: int = 5,
                world_size: int = 2) -> tuple[SearchEngine, Store]:
    """A search (not started) whose generation 0 is the fast path's result: the result is written next to the
    workload, its stages stored in fp's database are the lineage's first nodes, the knob block is the design
    space. Two ranks under `symm` at the small preset, so it also runs on one GPU."""
    assert fp.workload_dir is not None and fp.store is not None
    result = Path(fp.workload_dir) / RESULT_FILE
    result.write_text(fp.current_code, encoding="utf-8")
    start = start_from(result, fp.store)
    wl = load_workload(fp.workload_dir)
    return new_search(fp.workload_dir, choice.evaluator, db=fp.store.path, gate="auto", generations=generations,
                      proposals_per_generation=2, world_size=world_size, backend="symm",
                      params=dict(wl.size_presets.get("small", {})), iters=5, start=start)
