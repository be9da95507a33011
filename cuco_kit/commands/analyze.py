"""`cuco analyze FILE [--json]`: the communication analysis of a CUDA source, as a summary or as JSON."""
from __future__ import annotations

import argparse
import json

from cuco_kit.source.analysis import analyze_file
from cuco_kit.terminal import clean

HELP = "communication analysis of a CUDA source"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="CUDA source file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    report = analyze_file(args.file)
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2))
    else:
        print(clean(report.summary()))  # names come from the source file
    return 0
