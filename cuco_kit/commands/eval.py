"""`cuco eval CANDIDATE --workload DIR --ranks N --backend nccl|symm [--size M=..] [--iters] [--db] [--json]`.

Runs the cascade. Without a GPU it runs L0 and L1 and says which levels it could not run (the result is badged
"unmeasured"); it never makes up a number. On a terminal, a progress bar on stderr follows the cascade level by
level. Exit code 0 for pass or unavailable, 1 for a failed candidate, 2 for bad input: the flags, sizes,
candidate and workload are checked before anything is built.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import LEVELS, EvalRequest, EvalResult, checked_against, timing_medians
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.source.source_file import read_source
from cuco_kit.store import Store
from cuco_kit.terminal import clean
from cuco_kit.workload import MAX_RANKS, load_workload, parse_overrides

HELP = "evaluate a candidate (L0-L3) on N ranks"
MAX_ITERS = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", help="candidate .cu file")
    parser.add_argument("--workload", required=True, help="workload directory (sample_kernels/<name>)")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--backend", choices=["nccl", "symm"], default="nccl")
    parser.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                        help="override a workload parameter (repeatable)")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations")
    parser.add_argument("--db", help="store the outcome in this SQLite database")
    parser.add_argument("--json", action="store_true")


def _store(db: str, req: EvalRequest, result: EvalResult, workload_name: str) -> int:
    st = Store(db)
    try:
        config = {"command": "cuco eval", "request": json.loads(req.to_json())}
        run = st.create_run(workload=workload_name, config=config, seed=req.seed, badge=result.badge)
        prog = st.add_program(run_id=run, code=req.candidate_code, parent_id=None, source="human",
                              name=req.label or "cuco eval")
        ev = st.start_evaluation(prog, world_size=req.world_size, backend=req.backend, badge=result.badge,
                                 request=json.loads(req.to_json()))
        st.finish_evaluation(ev, result.to_dict())
        return ev
    finally:
        st.close()


def _levels_run(res: EvalResult) -> tuple[list[str], list[str]]:
    order: list[str] = list(LEVELS)
    reached = order.index(res.level_reached)
    if res.verdict == "unavailable":
        return order[: reached + 1], order[reached + 1:]
    return order[: reached + 1], []


def run(args: argparse.Namespace) -> int:
    # Every input is checked before anything is built: a bad flag or size costs nothing.
    if not 1 <= args.ranks <= MAX_RANKS:
        raise BadInput(f"--ranks {args.ranks}: must be between 1 and {MAX_RANKS}")
    if not 1 <= args.iters <= MAX_ITERS:
        raise BadInput(f"--iters {args.iters}: must be between 1 and {MAX_ITERS}")
    if args.db and not Path(args.db).resolve().parent.is_dir():
        raise BadInput(f"--db {args.db}: folder {Path(args.db).parent} does not exist; create it first")
    code = read_source(args.candidate, "candidate")
    wl = load_workload(args.workload)
    params = parse_overrides(args.size)
    wl.check(params, args.ranks)
    if args.db:
        Store(args.db).close()  # a --db it cannot store into is refused now, not after the evaluation
    req = EvalRequest(candidate_code=code, workload_dir=str(Path(args.workload).resolve()), params=params,
                      world_size=args.ranks, backend=args.backend, iters=args.iters, label=Path(args.candidate).name)
    bar = tqdm(total=len(LEVELS), unit="level", desc=Path(args.candidate).name, file=sys.stderr, leave=False,
               disable=args.json or not sys.stderr.isatty())

    def progress(ev: dict[str, Any]) -> None:
        level = ev.get("level")
        if level in LEVELS:
            bar.update(max(0, LEVELS.index(level) - bar.n))  # the levels before this one are done
            bar.set_postfix_str(f"{level} {ev.get('step')} {ev.get('done')}/{ev.get('total')}")
        if not args.json and ev.get("rank") in (None, 0) and ev.get("done") == ev.get("total"):
            tqdm.write(clean(f"  {ev.get('level')} {ev.get('step')} done"), file=sys.stderr)

    ev = GpuEvaluator()
    try:
        res = ev.evaluate(req, progress)
    finally:
        ev.close()
        bar.close()
    ran, not_run = _levels_run(res)
    if args.db:
        res.provenance["db_evaluation_id"] = _store(args.db, req, res, wl.name)
    if args.json:
        out = res.to_dict()
        out["levels_run"], out["levels_not_run"] = ran, not_run
        print(json.dumps(out, indent=1, default=str))
    else:
        # The reason and the notes may quote the candidate or its build log: cleaned of control characters.
        print(clean(f"{Path(args.candidate).name}: {res.verdict} at {res.level_reached} [{res.badge}]"
                    + (f" - {res.reason}" if res.reason else "")))
        if not_run:
            print(f"levels not evaluated: {', '.join(not_run)}")
        if res.oracle is not None:
            print(f"outputs {checked_against(res.oracle)}")
        if res.median_ms is not None:
            print(f"median {res.median_ms:.4f} ms (p10-p90 spread {res.spread_ms:.4f} ms) over "
                  f"{len(res.iteration_ms or [])} iterations, max over {args.ranks} rank(s)")
            score, dev, e2e = timing_medians(res.timing)
            if score is not None:
                print(f"timing: device {'-' if dev is None else f'{dev:.4f} ms'}, end to end "
                      f"{'-' if e2e is None else f'{e2e:.4f} ms'} (host launches included); the score is {score}")
        if res.speedup is not None:
            print(f"seed {res.seed_median_ms:.4f} ms -> speed-up {res.speedup:.2f}x"
                  + ("  FLAGGED (> 3x: review before it counts)" if res.flagged else ""))
        for n in res.provenance.get("notes", []):
            print(clean(f"note: {n}"))
    return 0 if res.verdict in ("pass", "unavailable") else 1
