"""`cuco open BUNDLE [--into DIR]`: check and unpack a run bundle, then say what it holds and how to look at it.

Nothing runs: the database opens read-only (its numbers badged replayed, with the GPU, driver and date they were
measured on), so no GPU and no LLM is needed. Notebook 00 draws the run when CUCO_BUNDLE names the bundle.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from cuco_kit.terminal import clean
from cuco_kit.workbench.bundle import open_bundle

HELP = "open a run bundle (cuco bundle) with no GPU and no LLM: summary and where to look"
BUNDLE_ENV = "CUCO_BUNDLE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", help="a .cucobundle file")
    parser.add_argument("--into", help="folder to unpack into (default: a new temporary folder)")


def run(args: argparse.Namespace) -> int:
    opened = open_bundle(args.bundle, into=args.into)
    print(clean(opened.summary()))
    print(f"unpacked to {opened.directory}; the database (read-only): {opened.store_path}")
    print(f"to see it in the workbench: {BUNDLE_ENV}={Path(args.bundle).resolve()} and open "
          "notebooks/00_quickstart.ipynb (section 'A run bundle')")
    return 0
