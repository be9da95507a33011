"""`cuco check CANDIDATE [--parent PARENT] [--json]`: the L0 static check of a candidate against its parent.

Exit code 0 when accepted, 1 when rejected: the reasons go to stderr, or into the JSON verdict on stdout.
"""
from __future__ import annotations

import argparse
import json
import sys

from cuco_kit.source.static_check import check_candidate, load_source
from cuco_kit.terminal import clean

HELP = "L0 static check of a candidate against its parent"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", help="candidate .cu file")
    parser.add_argument("--parent", help="parent .cu file; bytes outside EVOLVE blocks must match it")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


def run(args: argparse.Namespace) -> int:
    code = load_source(args.candidate, "candidate")
    parent = load_source(args.parent, "parent") if args.parent else None
    report = check_candidate(code, parent)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif report.ok:
        rules = f", {len(report.rules)} knob rule(s) kept" if report.rules else ""
        print(f"accepted: {len(report.blocks)} EVOLVE block(s){rules}, cell {report.cell}, frozen sha256 "
              f"{report.frozen_hash}")
    else:
        print(f"rejected ({len(report.reasons)} reason(s)):", file=sys.stderr)
        for reason in report.reasons:
            print(clean(f"  {reason}"), file=sys.stderr)  # reasons quote the candidate
    return 0 if report.ok else 1
