"""`cuco eval CANDIDATE --workload DIR --ranks N --backend nccl|symm [--size M=..] [--iters] [--db] [--json]`.

Runs the cascade. Without a GPU it runs L0 and L1 and says which levels it could not run; it never makes up a
number.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput


def _read(path: str, what: str) -> str:
    p = Path(path)
    try:
        return p.read_text()
    except OSError as exc:
        raise BadInput(f"{what} {p}: cannot read ({exc.strerror})") from None


def _store(db: str, req: Any, result: Any, workload_name: str) -> int:
    from cuco_kit.store import Store

    st = Store(db)
    try:
        run = st.create_run(workload=workload_name, config={"command": "cuco eval", "request": json.loads(req.to_json())},
                            seed=req.seed, badge=result.badge)
        prog = st.add_program(run_id=run, code=req.candidate_code, parent_id=None, source="human",
                              name=req.label or "cuco eval")
        ev = st.start_evaluation(prog, world_size=req.world_size, backend=req.backend, badge=result.badge,
                                 request=json.loads(req.to_json()))
        st.finish_evaluation(ev, result.to_dict())
        return ev
    finally:
        st.close()


def _levels_run(res: Any) -> tuple[list[str], list[str]]:
    order = ["L0", "L1", "L2", "L3"]
    reached = order.index(res.level_reached)
    if res.verdict == "unavailable":
        return order[: reached + 1], order[reached + 1:]
    return order[: reached + 1], []


def cli_eval(args: argparse.Namespace) -> int:
    from cuco_kit.evaluate.api import EvalRequest
    from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
    from cuco_kit.workload import load_workload, parse_overrides

    code = _read(args.candidate, "candidate")
    wl = load_workload(args.workload)
    params = parse_overrides(args.size)
    wl.resolve(params)
    if args.ranks < 1:
        raise BadInput(f"--ranks {args.ranks}: must be >= 1")
    if args.iters < 1:
        raise BadInput(f"--iters {args.iters}: must be >= 1")
    req = EvalRequest(candidate_code=code, workload_dir=str(Path(args.workload).resolve()), params=params,
                      world_size=args.ranks, backend=args.backend, iters=args.iters, label=Path(args.candidate).name)
    events: list[dict] = []

    def progress(ev: dict) -> None:
        events.append(ev)
        if not args.json and ev.get("rank") in (None, 0) and ev.get("done") == ev.get("total"):
            print(f"  {ev.get('level')} {ev.get('step')} done", file=sys.stderr, flush=True)

    ev = GpuEvaluator()
    try:
        res = ev.evaluate(req, progress)
    finally:
        ev.close()
    ran, not_run = _levels_run(res)
    if args.db:
        res.provenance["db_evaluation_id"] = _store(args.db, req, res, wl.name)
    if args.json:
        out = res.to_dict()
        out["levels_run"], out["levels_not_run"] = ran, not_run
        print(json.dumps(out, indent=1, default=str))
    else:
        print(f"{Path(args.candidate).name}: {res.verdict} at {res.level_reached}"
              + (f" - {res.reason}" if res.reason else ""))
        if not_run:
            print(f"levels not evaluated: {', '.join(not_run)}")
        if res.median_ms is not None:
            print(f"median {res.median_ms:.4f} ms (p10-p90 spread {res.spread_ms:.4f} ms) over {len(res.iteration_ms or [])}"
                  f" iterations, max over {args.ranks} rank(s)")
        if res.speedup is not None:
            print(f"seed {res.seed_median_ms:.4f} ms -> speed-up {res.speedup:.2f}x"
                  + ("  FLAGGED (> 3x: review before it counts)" if res.flagged else ""))
        for n in res.provenance.get("notes", []):
            print(f"note: {n}")
    return 0 if res.verdict in ("pass", "unavailable") else 1
