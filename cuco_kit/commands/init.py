"""`cuco init PROGRAM.cu --workload DIR [--plan PLAN.json] [--plan-only] [--name NAME] [--force] [--llm [LLM
flags]]`: import a host-driven CUDA + NCCL program as a workload folder (docs/your_kernel.md).

The plan (tensors, scratch, sizes, where the step is, what it leaves out) is printed first. It is always written
to DIR/cuco_plan.json when it comes from the analysis; `--plan FILE` (or a plan already in DIR) is used instead
of the analysis. What the analysis could not decide is in the plan's `todo`: while anything is open or
inconsistent, every problem is printed (one line each) and nothing else is written (exit 2); correct the plan and
run cuco init again. `--plan-only` stops after the plan. The folder gets the plan, the original program, the
deterministic seed in the candidate ABI and workload.py, whose oracle is the seed until a torch reference is
approved; `cuco check-workload DIR` lists what is left. `--llm` then asks an LLM for the port and the reference,
each shown with its checks for a decision on the terminal (commands/import_review.py). Exit code 0, or 2 for bad
input (a program with no NCCL call is refused in one line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cuco_kit.commands.import_review import review_import
from cuco_kit.commands.llm_options import (
    PROBE_TIMEOUT_S,
    add_llm_arguments,
    check_llm_arguments,
    check_llm_reachable,
    llm_config,
)
from cuco_kit.errors import BadInput
from cuco_kit.importer.plan import ImportPlan, check_plan
from cuco_kit.importer.session import ImportSession
from cuco_kit.importer.workload_writer import PLAN_FILE
from cuco_kit.llm import Ledger, LedgeredClient, OpenAICompatibleClient
from cuco_kit.source.source_file import MAX_JSON_BYTES, read_text
from cuco_kit.terminal import clean, one_line

HELP = "import a host-driven CUDA + NCCL program as a workload folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("program", help="the host program (.cu with main(), NCCL setup and a per-step loop)")
    parser.add_argument("--workload", required=True, help="the workload folder to write")
    parser.add_argument("--plan", help="an import plan (JSON) to use instead of the analysis")
    parser.add_argument("--plan-only", action="store_true", help="write only DIR/cuco_plan.json, to correct it")
    parser.add_argument("--name", help="the workload's name (default: the program's file name)")
    parser.add_argument("--force", action="store_true", help="replace an existing workload.py")
    parser.add_argument("--llm", action="store_true",
                        help="then ask an LLM for the port and the torch reference, each for a decision on the "
                             "terminal: approve, reject NOTE, edit FILE, keep")
    parser.add_argument("--model", help="LLM model name for --llm (default: $CUCO_MODEL or the config)")
    add_llm_arguments(parser, scope="import")


def plan_summary(plan: ImportPlan) -> str:
    what = "the loop at" if plan.step_kind == "loop" else "the statements at"
    via = f" (main() calls it at line(s) {', '.join(map(str, plan.call_lines))})" if plan.call_lines else ""
    lines = [f"plan for {plan.program} -> workload {plan.name!r}",
             f"  step: {what} lines {plan.step_start}-{plan.step_end} of {plan.step_function}(){via}; communicator "
             f"{plan.comm}, rank {plan.rank or '-'}, world {plan.world or '-'}; harness stream <- {plan.main_stream}"
             + (f"; side streams {', '.join(plan.side_streams)}" if plan.side_streams else "")
             + (f"; one process drives {plan.devices} devices: the seed runs one per rank" if plan.devices else ""),
             "  sizes: " + (", ".join(f"{k}={v}" + (" (fixed)" if k in plan.fixed_sizes else "")
                                      for k, v in plan.sizes.items()) or "none")
             + (f"; runs on {plan.worlds} rank(s)" if plan.worlds else "")]
    for b in plan.buffers:
        lines.append(f"  {b.role:8s} {b.name}: {b.dtype}[{b.count}]")
    lines += [f"  left out: L{x.line} {x.code} ({x.why})" for x in plan.left_out]
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [f"  TODO: {t}" for t in plan.todo]
    return clean("\n".join(lines))


def _check_folder(d: Path) -> None:
    """BadInput unless ``d`` is a folder or can become one: it, or the nearest part of its path that exists, is
    a folder."""
    for existing in (d, *d.parents):
        if existing.exists():
            if not existing.is_dir():
                where = "is" if existing == d else f"lies under {existing}, which is"
                raise BadInput(f"--workload {d}: {where} a file, not a folder; name a new folder or a workload "
                               "folder")
            return


def _load_plan(path: Path, what: str) -> ImportPlan:
    text = read_text(path, what, kind="a JSON import plan", max_bytes=MAX_JSON_BYTES)
    try:
        return ImportPlan.from_json(text, f"{what} {path}")
    except RecursionError:
        raise BadInput(f"{what} {path}: nested too deeply to be an import plan") from None


def run(args: argparse.Namespace) -> int:
    d = Path(args.workload)
    _check_folder(d)
    plan_path = Path(args.plan) if args.plan else (d / PLAN_FILE if (d / PLAN_FILE).is_file() else None)
    plan = _load_plan(plan_path, "--plan" if args.plan else "plan") if plan_path is not None else None
    llm = None
    if args.llm and not args.plan_only:
        # checked before anything is written: a missing server costs nothing
        check_llm_arguments(args)
        cfg = llm_config(args, model=args.model or None)
        check_llm_reachable(cfg.base_url or "", min(args.llm_timeout, PROBE_TIMEOUT_S))
        # the import's own calls only: nothing is stored, so the budgets count this run
        llm = LedgeredClient(OpenAICompatibleClient(cfg),
                             Ledger(None, budget_dollars=args.llm_budget, budget_tokens=args.llm_token_budget))
    session = ImportSession(args.program, d, name=args.name, plan=plan, llm=llm)
    if plan_path is not None:
        print(f"using the plan in {plan_path}")
    print(plan_summary(session.plan))
    problems = check_plan(session.plan, session.code)
    try:
        if args.plan_only or problems:
            if plan_path != d / PLAN_FILE:
                d.mkdir(parents=True, exist_ok=True)
                print(f"wrote {session.plan.save(d / PLAN_FILE)}")
            for p in problems:
                print(f"cuco init: {one_line(p)}", file=sys.stderr)
            if problems:
                print(f"cuco init: {len(problems)} problem(s) in the plan: correct {d / PLAN_FILE}, then run cuco "
                      f"init {args.program} --workload {d} again", file=sys.stderr)
                return 2
            print(f"correct it if needed, then run: cuco init {args.program} --workload {d}")
            return 0
        session.write(overwrite=args.force)
    except OSError as exc:
        raise BadInput(f"--workload {d}: cannot write the workload folder ({exc.strerror or exc})") from None
    print(f"wrote {d}: {PLAN_FILE}, original.cu, seed_nccl.cu, workload.py")
    if llm is None:
        print(f"next: write the torch reference where workload.py says TODO(cuco init), then: cuco check-workload "
              f"{d}")
        return 0
    for line in review_import(session, sys.stdin, sys.stdout):
        print(clean(line))
    print(f"next: cuco check-workload {d}; on a GPU the seed must pass L2 against the reference before the fast "
          "path")
    return 0
