"""`cuco`: the headless command line. Each subcommand is a thin call into the engine's Python API.

Subcommand handlers are imported lazily so `cuco check` does not pay for torch, and a missing optional
dependency is reported for the command that needs it only.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from cuco_kit.errors import CucoError

# name -> (module, function, help). Each function takes the parsed args and returns an exit code.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("cuco_kit.blocks", "cli_check", "L0 static check of a candidate against its parent"),
    "analyze": ("cuco_kit.analysis", "cli_analyze", "communication analysis of a CUDA source"),
    "eval": ("cuco_kit.evaluate.cli", "cli_eval", "evaluate a candidate (L0-L3) on N ranks"),
    "fastpath": ("cuco_kit.fastpath", "cli_fastpath", "host-to-device rewrite of a seed (LLM loop)"),
    "search": ("cuco_kit.search.cli", "cli_search", "evolutionary search over a workload"),
}


def _add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    if name == "check":
        p.add_argument("candidate", help="candidate .cu file")
        p.add_argument("--parent", help="parent .cu file; bytes outside EVOLVE blocks must match it")
        p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    elif name == "analyze":
        p.add_argument("file", help="CUDA source file")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
    elif name == "eval":
        p.add_argument("candidate", help="candidate .cu file")
        p.add_argument("--workload", required=True, help="workload directory (sample_kernels/<name>)")
        p.add_argument("--ranks", type=int, default=1)
        p.add_argument("--backend", choices=["nccl", "symm"], default="nccl")
        p.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                       help="override a workload parameter (repeatable)")
        p.add_argument("--iters", type=int, default=20, help="timed iterations")
        p.add_argument("--db", help="store the outcome in this SQLite database")
        p.add_argument("--json", action="store_true")
    elif name == "fastpath":
        p.add_argument("seed", help="seed .cu file in candidate form (host collectives in cuco_step)")
        p.add_argument("--backend", choices=["lsa", "gin"], default="lsa")
        p.add_argument("--workload", help="workload directory, for L2 when a GPU is present")
        p.add_argument("--model", help="LLM model name (default: $CUCO_MODEL or the config)")
        p.add_argument("--max-attempts", type=int, default=3)
        p.add_argument("--db", help="SQLite database for proposals and the LLM ledger")
        p.add_argument("--out", help="write the final candidate here")
        p.add_argument("--json", action="store_true")
    elif name == "search":
        p.add_argument("workload", help="workload directory (sample_kernels/<name>)")
        p.add_argument("--mutator", choices=["offline", "llm", "mixed"], default="offline")
        p.add_argument("--generations", type=int, default=10)
        p.add_argument("--db", required=True, help="SQLite database of the run (resumed if it exists)")
        p.add_argument("--ranks", type=int, default=1)
        p.add_argument("--backend", choices=["nccl", "symm"], default="nccl")
        p.add_argument("--seed", type=int, default=0, help="random seed of the search")
        p.add_argument("--evaluator", choices=["gpu", "replay", "simulated"], default="gpu")
        p.add_argument("--json", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuco", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, help_text) in _COMMANDS.items():
        _add_arguments(name, sub.add_parser(name, help=help_text, description=help_text))
    return parser


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    module, func, _ = _COMMANDS[name]
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS:
        print(f"cuco: unknown command {argv[0]!r}; commands: {', '.join(_COMMANDS)}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(_handler(args.command)(args) or 0)
    except CucoError as exc:
        print(f"cuco {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cuco {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
