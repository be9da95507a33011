"""`cuco search WORKLOAD ...`: a headless search with a live log (or a JSON summary)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput


def _evaluator(args: argparse.Namespace, workload_dir: Path, workload_name: str) -> Any:
    if args.evaluator == "simulated":
        from cuco_kit.evaluate.simulated import SimulatedEvaluator

        return SimulatedEvaluator(seed=args.seed)
    if args.evaluator == "replay":
        from cuco_kit.evaluate.replay import ReplayEvaluator

        candidates = [os.environ.get("CUCO_REPLAY_DB"), workload_dir / "replay.db",
                      Path("benchmarks/search") / f"{workload_name}.db"]
        for c in candidates:
            if c and Path(c).is_file():
                return ReplayEvaluator(c)
        raise BadInput("--evaluator replay needs a replay database: set CUCO_REPLAY_DB, or commit one as "
                       f"{workload_dir / 'replay.db'} or benchmarks/search/{workload_name}.db")
    try:
        from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
    except ImportError as exc:
        raise BadInput(f"--evaluator gpu is not available here ({exc}); use --evaluator simulated or replay") \
            from None
    return GpuEvaluator()


def _sources(mutator: str) -> list[Any]:
    from cuco_kit.search.design_space import DesignSpaceSource

    out: list[Any] = []
    if mutator in ("offline", "mixed"):
        out.append(DesignSpaceSource())
    if mutator in ("llm", "mixed"):
        from cuco_kit.llm.openai_client import LLMConfig, OpenAICompatibleClient
        from cuco_kit.search.llm_source import LLMSource

        out.append(LLMSource(OpenAICompatibleClient(LLMConfig())))
    return out


def _printer(as_json: bool) -> Any:
    def show(event: Any) -> None:
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
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    return show


def cli_search(args: argparse.Namespace) -> int:
    from cuco_kit.events import EventBus
    from cuco_kit.search.budget import BudgetConfig
    from cuco_kit.search.config import SearchConfig
    from cuco_kit.search.engine import SearchEngine
    from cuco_kit.store import Store
    from cuco_kit.workload import load_workload

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
    try:
        summary = engine.run()
    except KeyboardInterrupt:
        engine.stop()
        raise
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
    else:
        s = summary
        best = (f"best program {s.best_program_id} at {s.best_speedup:.3f}x the seed"
                if s.best_program_id is not None else "no passing program")
        print(f"run {s.run_id} {s.state} ({s.reason}): {s.generations} generations, {s.evaluations} evaluations "
              f"[{s.badge}], {best}; database {db}")
    return 0
