"""`cuco bundle RUN.sqlite -o run.cucobundle [--llm-recording REC.jsonl ...]`: one file that carries a run.

The bundle (cuco_kit/workbench/bundle.py) holds the run's database, its evaluations' provenance and kernel timelines
and the LLM recordings given; `cuco open` replays it anywhere, with no GPU and no LLM.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from cuco_kit.terminal import clean
from cuco_kit.workbench.bundle import SUFFIX, open_bundle, write_bundle

HELP = "pack a run's database, provenance, timelines and LLM recordings into one file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", help="the run's SQLite database (cuco search --db)")
    parser.add_argument("-o", "--output", help=f"the bundle to write (default: the database's name + {SUFFIX})")
    parser.add_argument("--llm-recording", action="append", default=[], metavar="REC.jsonl",
                        help="an LLM recording to include (repeatable)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.output) if args.output else Path(args.db).with_suffix(SUFFIX)
    path = write_bundle(args.db, out, llm_recordings=args.llm_recording)
    opened = open_bundle(path)  # what a reader will see, checked now
    try:
        print(clean(opened.summary()))
    finally:
        shutil.rmtree(opened.directory, ignore_errors=True)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); open it anywhere with: cuco open {path}")
    return 0
