"""`cuco fastpath SEED --backend lsa|gin [--workload DIR] [--model M] [--rewrite-model M] [--judge-model M]
[--single-stage] [--max-attempts N] [--db PATH] [--out FILE] [--json] [--manual] [--llm-timeout S] [--llm-retries N]
[--llm-budget DOLLARS] [--llm-token-budget TOKENS] [--record DIR | --replay DIR]`: the host-to-device rewrite of
a seed with an LLM (docs/fastpath.md). The rewrite and the judge are model roles: each defaults to --model
($CUCO_MODEL), so a cheap model can take the judge's calls. `--record DIR` keeps every LLM call and its answer in
DIR; `--replay DIR` answers them from there without a server.

Exit code 0 when the run reached its goal (as far as this machine can check), 1 otherwise, 2 for bad input.
Before any work it checks the flags and that the LLM server answers, so a missing server is one line saying how
to point cuco at one. The LLM budget is per database: earlier runs in the same --db count against it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from cuco_kit.commands.llm_options import (
    LLM_HINT,
    PROBE_TIMEOUT_S,
    add_llm_arguments,
    check_budget_left,
    check_llm_arguments,
    check_llm_reachable,
    llm_config,
)
from cuco_kit.commands.llm_recording import add_recording_arguments, call_log, replay_miss
from cuco_kit.commands.manual_review import run_manual
from cuco_kit.errors import BadInput
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.fastpath import NO_GPU, FastPath, FastPathConfig, FastPathResult
from cuco_kit.llm import LLMClient, OpenAICompatibleClient
from cuco_kit.source.static_check import load_source
from cuco_kit.store import Store
from cuco_kit.terminal import clean

HELP = "host-to-device rewrite of a seed (LLM loop)"
MAX_ATTEMPTS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("seed", help="seed .cu file in candidate form (host collectives in cuco_step)")
    parser.add_argument("--backend", choices=["lsa", "gin"], default="lsa")
    parser.add_argument("--workload", help="workload directory, for L2 when a GPU is present")
    parser.add_argument("--model", help="LLM model name (default: $CUCO_MODEL or the config)")
    parser.add_argument("--rewrite-model", metavar="NAME", help="model that writes the stages (default: --model)")
    parser.add_argument("--judge-model", metavar="NAME",
                        help="model that diagnoses failed attempts (default: --model); it may be a cheaper one")
    parser.add_argument("--single-stage", action="store_true",
                        help="one rewrite from the seed to device code instead of Stage A then Stage B")
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--db", help="SQLite database for proposals and the LLM ledger")
    parser.add_argument("--out", help="write the final candidate here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--manual", action="store_true",
                        help="stop at each attempt for a decision on the terminal: approve, reject NOTE, edit FILE")
    add_llm_arguments(parser)
    add_recording_arguments(parser)


def _print_summary(res: FastPathResult, out: TextIO | None = None) -> None:
    out = out if out is not None else sys.stdout
    # Messages, reasons and diagnoses carry LLM and compiler text: cleaned of control characters.
    print(clean(f"fast path: {res.status}: {res.message}"), file=out)
    for stage, oc in res.outcomes.items():
        print(clean(f"  stage {stage}: {oc.status} ({len(oc.attempts)} attempt(s)) {oc.message}"), file=out)
        for a in oc.attempts:
            print(clean(f"    #{a.number} [{a.source}] {a.verdict} at {a.level or '-'}: {a.reason}"), file=out)
            if a.diagnosis:
                print(clean(f"      diagnosis: {a.diagnosis.splitlines()[0][:160]}"), file=out)
    t = res.ledger
    if t:
        print(f"  LLM: {t.get('calls', 0)} call(s), {t.get('failed', 0)} failed, "
              f"{t.get('prompt_tokens', 0)}+{t.get('completion_tokens', 0)} tokens, ${t.get('dollars', 0):.4f}",
              file=out)


def _check_arguments(args: argparse.Namespace) -> None:
    check_llm_arguments(args)
    if not 1 <= args.max_attempts <= MAX_ATTEMPTS:
        raise BadInput(f"--max-attempts {args.max_attempts}: must be between 1 and {MAX_ATTEMPTS}")
    if args.workload is not None and not (Path(args.workload) / "workload.py").is_file():
        raise BadInput(f"--workload {args.workload}: not a workload directory (no workload.py)")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise BadInput(f"--out {args.out}: folder {Path(args.out).parent} does not exist; create it first")


def run(args: argparse.Namespace) -> int:
    # Everything is checked before the first LLM call: a bad flag costs nothing.
    _check_arguments(args)
    seed = load_source(args.seed, "seed")
    calls = call_log(args)
    cfg_llm = llm_config(args, model=getattr(args, "rewrite_model", None) or args.model or None)
    if calls is None or calls.mode != "replay":  # a replay asks no server
        check_llm_reachable(cfg_llm.base_url or "", min(args.llm_timeout, PROBE_TIMEOUT_S))
    client: LLMClient = OpenAICompatibleClient(cfg_llm)
    judge_name = getattr(args, "judge_model", None) or args.model or None
    judge_client: LLMClient | None = None
    if judge_name is not None and judge_name != cfg_llm.model:
        judge_client = OpenAICompatibleClient(llm_config(args, model=judge_name))
    if calls is not None:
        client = calls.wrap(client)
        judge_client = calls.wrap(judge_client) if judge_client is not None else None
    workload = args.workload
    evaluator: GpuEvaluator | None = None
    gpu = gpu_present()
    store = Store(args.db) if args.db else None
    if store is not None:
        try:
            check_budget_left(store, cfg_llm.model or "", args, args.db)
        except BadInput:
            store.close()
            raise
    if workload is not None and gpu:
        evaluator = GpuEvaluator()
    config = FastPathConfig(backend=args.backend, max_attempts=int(args.max_attempts), gpu=gpu,
                            budget_dollars=args.llm_budget, budget_tokens=args.llm_token_budget,
                            manual=bool(getattr(args, "manual", False)),
                            single_stage=bool(getattr(args, "single_stage", False)),
                            rewrite_model=cfg_llm.model, judge_model=judge_name or cfg_llm.model)
    try:
        fp = FastPath(seed, workload, client, evaluator, store, config, seed_name=Path(args.seed).name,
                      judge_llm=judge_client)
        if fp.seed_blocks:
            # the mapping of the seed's own blocks (CUCo's unnamed ones get block_<n>), before they are set aside
            print(clean(f"{fp.block_names or 'the seed has EVOLVE blocks'}; the stages work on the code without "
                        "them and the annotate step places the result's blocks"),
                  file=sys.stderr if args.json else sys.stdout)
        res = run_manual(fp, sys.stdin, sys.stderr) if config.manual else fp.run()
    finally:
        if evaluator is not None:
            evaluator.close()
        if store is not None:
            store.close()
    if args.out and res.ok:
        Path(args.out).write_text(res.code, encoding="utf-8")
    # A replay that could not answer a call (a stage's or the judge's) fails the run: it is not the recorded one.
    miss = replay_miss(calls)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
        if miss is not None:
            print(f"cuco fastpath: {clean(miss)}", file=sys.stderr)
    else:
        _print_summary(res)
        if miss is not None:
            print(f"cuco fastpath: {clean(miss)}", file=sys.stderr)
        elif res.status == "llm_error":
            refused = any((e.error or "").startswith("refused") for e in fp.ledger.entries)
            print("hint: " + ("the LLM budget is per database (--db): raise --llm-budget or --llm-token-budget"
                              if refused else LLM_HINT), file=sys.stderr)
        if not gpu:
            print(f"note: {NO_GPU}", file=sys.stderr)
    return 0 if res.ok and miss is None else 1
