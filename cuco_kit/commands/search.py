"""`cuco search WORKLOAD ...`: a headless search with a live log (or a JSON summary).

On a terminal, a progress bar on stderr counts generations, evaluations and the best speed-up so far.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import Evaluator
from cuco_kit.evaluate.replay import ReplayEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import Event, EventBus
from cuco_kit.llm import LLMConfig, OpenAICompatibleClient
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.proposal import ProposalSource
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

HELP = "evolutionary search over a workload"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="workload directory (sample_kernels/<name>)")
    parser.add_argument("--mutator", choices=["offline", "llm", "mixed"], default="offline")
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--db", required=True, help="SQLite database of the run (resumed if it exists)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--backend", choices=["nccl", "symm"], default="nccl")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search")
    parser.add_argument("--evaluator", choices=["gpu", "replay", "simulated"], default="gpu")
    parser.add_argument("--json", action="store_true")


def _evaluator(args: argparse.Namespace, workload_dir: Path, workload_name: str) -> Evaluator:
    if args.evaluator == "simulated":
        return SimulatedEvaluator(seed=args.seed)
    if args.evaluator == "replay":
        candidates = [os.environ.get("CUCO_REPLAY_DB"), workload_dir / "replay.db",
                      Path("benchmarks/search") / f"{workload_name}.db"]
        for c in candidates:
            if c and Path(c).is_file():
                return ReplayEvaluator(c)
        raise BadInput("--evaluator replay needs a replay database: set CUCO_REPLAY_DB, or commit one as "
                       f"{workload_dir / 'replay.db'} or benchmarks/search/{workload_name}.db")
    try:
        # The GPU evaluator imports torch: only a GPU search pays for it.
        from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
    except ImportError as exc:
        raise BadInput(f"--evaluator gpu is not available here ({exc}); use --evaluator simulated or replay") \
            from None
    return GpuEvaluator()


def _sources(mutator: str) -> list[ProposalSource]:
    out: list[ProposalSource] = []
    if mutator in ("offline", "mixed"):
        out.append(DesignSpaceSource())
    if mutator in ("llm", "mixed"):
        out.append(LLMSource(OpenAICompatibleClient(LLMConfig())))
    return out


def _printer(as_json: bool) -> Callable[[Event], None]:
    out = sys.stderr if as_json else sys.stdout

    def show(event: Event) -> None:
        d = event.data
        if event.kind == "evaluation_finished":
            extra = (f"{d['median_ms']:.4f} ms, {d['speedup']:.3f}x" if d.get("median_ms") is not None and
                     d.get("speedup") is not None else f"{d.get('reason', '')[:100]}")
            line = f"eval {d['evaluation_id']} program {d['program_id']}: {d['verdict']} at " \
                   f"{d['level_reached']} [{d['badge']}] {extra}"
        elif event.kind == "proposal":
            line = f"proposal {d['proposal_id']} ({d['source']}) from program {d['parent_id']}: {d['name']}"
        elif event.kind == "new_best":
            line = f"NEW BEST program {d['program_id']}: {d['speedup']:.3f}x"
        elif event.kind in ("run_state", "log"):
            line = f"{event.kind}: {d.get('state', '')}{d.get('message', '')} {d.get('reason', '')}".rstrip()
        else:
            return
        tqdm.write(line, file=out)  # above the progress bar, when there is one
        out.flush()

    return show


def _progress_bar(engine: SearchEngine, bar: tqdm) -> Callable[[Event], None]:
    evaluations = 0
    best = "-"

    def show(event: Event) -> None:
        nonlocal evaluations, best
        if event.kind == "evaluation_finished":
            evaluations += 1
        elif event.kind == "new_best":
            best = f"{event.data['speedup']:.3f}x"
        bar.update(max(0, engine.generation - bar.n))
        bar.set_postfix_str(f"{evaluations} evaluations, best {best}")

    return show


def run(args: argparse.Namespace) -> int:
    workload_dir = Path(args.workload)
    wl = load_workload(workload_dir)
    db = Path(args.db)
    if not db.parent.exists():
        raise BadInput(f"--db {db}: folder {db.parent} does not exist; create it first")
    store = Store(db)
    evaluator = _evaluator(args, workload_dir, wl.name)
    config = SearchConfig(world_size=args.ranks, backend=args.backend, seed=args.seed,
                          budget=BudgetConfig(generations=args.generations))
    if args.mutator == "offline":
        # Only the design-space source serves: every slot is a knob move.
        config.phases.explore.mix = {"design_space": 1.0}
        config.phases.exploit.mix = {"design_space": 1.0}
    events = EventBus()
    events.subscribe(_printer(args.json))
    engine = SearchEngine(workload_dir, store, evaluator, _sources(args.mutator), config, events)
    bar = tqdm(total=args.generations, unit="gen", desc=wl.name, file=sys.stderr, leave=False,
               disable=args.json or not sys.stderr.isatty())
    events.subscribe(_progress_bar(engine, bar))
    try:
        summary = engine.run()
    except KeyboardInterrupt:
        engine.stop()
        raise
    finally:
        bar.close()
        store.close()
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        s = summary
        best = (f"best program {s.best_program_id} at {s.best_speedup:.3f}x the seed"
                if s.best_program_id is not None else "no passing program")
        print(f"run {s.run_id} {s.state} ({s.reason}): {s.generations} generations, {s.evaluations} evaluations "
              f"[{s.badge}], {best}; database {db}")
    return 0
