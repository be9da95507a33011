"""`cuco check-workload DIR [--no-compile] [--json]`: what a workload folder still lacks or contradicts.

The reference runs on the CPU at the small preset (1 and 2 ranks) and its outputs must match the specs'
shapes; the tolerance must be set; no TODO(cuco init) place may be left; the import plan must agree with
workload.py; the seed must look up every tensor and compile (when nvcc is here). Exit code 0 when nothing is
missing, 1 otherwise, 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from cuco_kit.importer.check import check_workload
from cuco_kit.terminal import clean

HELP = "say what a workload folder still lacks (reference, shapes, tolerance, seed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="the workload folder")
    parser.add_argument("--no-compile", action="store_true", help="skip building the seed with nvcc")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    report = check_workload(args.workload, compile_seed=not args.no_compile)
    if args.json:
        print(json.dumps({"ok": report.ok, "findings": [asdict(f) for f in report.findings]}, indent=2))
    else:
        print(clean(report.text()))
        n = len(report.problems())
        print(f"{args.workload}: " + ("ready" if report.ok else f"{n} thing(s) to fix"))
    return 0 if report.ok else 1
