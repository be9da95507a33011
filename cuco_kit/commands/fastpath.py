"""`cuco fastpath SEED --backend lsa|gin [--workload DIR] [--model M] [--max-attempts N] [--db PATH] [--out FILE]
[--json]`: the host-to-device rewrite of a seed with an LLM (docs/fastpath.md).

Exit code 0 when the run reached its goal (as far as this machine can check), 1 otherwise. Before any work it
checks that something listens at the LLM server's address, so a missing server is one line saying how to
point cuco at one.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import TextIO
from urllib.parse import urlparse

from cuco_kit.errors import BadInput, CucoError
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.fastpath import NO_GPU, FastPath, FastPathConfig, FastPathResult
from cuco_kit.llm import LLMConfig, OpenAICompatibleClient
from cuco_kit.static_check import load_source
from cuco_kit.store import Store

HELP = "host-to-device rewrite of a seed (LLM loop)"
LLM_HINT = ("point cuco at an OpenAI-compatible server: export OPENAI_BASE_URL=http://localhost:8000/v1 (vLLM; "
            "Ollama: http://localhost:11434/v1, LM Studio: http://localhost:1234/v1) and OPENAI_API_KEY (any value "
            "for a local server), and name the model with --model or CUCO_MODEL")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("seed", help="seed .cu file in candidate form (host collectives in cuco_step)")
    parser.add_argument("--backend", choices=["lsa", "gin"], default="lsa")
    parser.add_argument("--workload", help="workload directory, for L2 when a GPU is present")
    parser.add_argument("--model", help="LLM model name (default: $CUCO_MODEL or the config)")
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--db", help="SQLite database for proposals and the LLM ledger")
    parser.add_argument("--out", help="write the final candidate here")
    parser.add_argument("--json", action="store_true")


def check_llm_reachable(base_url: str, timeout_s: float = 3.0) -> None:
    """Raise CucoError (one line, with the how-to) when nothing listens at the LLM server's host and port."""
    u = urlparse(base_url)
    host = u.hostname
    if not host or u.scheme not in ("http", "https"):
        raise CucoError(f"LLM server URL {base_url!r} is not an http(s) URL; {LLM_HINT}")
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise CucoError(f"no LLM server reachable at {base_url} ({exc.strerror or exc}); {LLM_HINT}") from None


def _print_summary(res: FastPathResult, out: TextIO | None = None) -> None:
    out = out if out is not None else sys.stdout
    print(f"fast path: {res.status}: {res.message}", file=out)
    for stage, oc in res.outcomes.items():
        print(f"  stage {stage}: {oc.status} ({len(oc.attempts)} attempt(s)) {oc.message}", file=out)
        for a in oc.attempts:
            print(f"    #{a.number} [{a.source}] {a.verdict} at {a.level or '-'}: {a.reason}", file=out)
            if a.diagnosis:
                print(f"      diagnosis: {a.diagnosis.splitlines()[0][:160]}", file=out)
    t = res.ledger
    if t:
        print(f"  LLM: {t.get('calls', 0)} call(s), {t.get('failed', 0)} failed, "
              f"{t.get('prompt_tokens', 0)}+{t.get('completion_tokens', 0)} tokens, ${t.get('dollars', 0):.4f}",
              file=out)


def run(args: argparse.Namespace) -> int:
    seed = load_source(args.seed, "seed")
    cfg_llm = LLMConfig(model=args.model or None)
    check_llm_reachable(cfg_llm.base_url or "")
    client = OpenAICompatibleClient(cfg_llm)
    workload = args.workload
    if workload is not None and not (Path(workload) / "workload.py").is_file():
        raise BadInput(f"--workload {workload}: not a workload directory (no workload.py)")
    evaluator: GpuEvaluator | None = None
    gpu = gpu_present()
    if workload is not None and gpu:
        evaluator = GpuEvaluator()
    store = Store(args.db) if args.db else None
    config = FastPathConfig(backend=args.backend, max_attempts=int(args.max_attempts), gpu=gpu)
    try:
        fp = FastPath(seed, workload, client, evaluator, store, config, seed_name=Path(args.seed).name)
        res = fp.run()
    finally:
        if evaluator is not None:
            evaluator.close()
        if store is not None:
            store.close()
    if args.out and res.ok:
        Path(args.out).write_text(res.code, encoding="utf-8")
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        _print_summary(res)
        if res.status == "llm_error":
            print(f"hint: {LLM_HINT}", file=sys.stderr)
        if not gpu:
            print(f"note: {NO_GPU}", file=sys.stderr)
    return 0 if res.ok else 1
