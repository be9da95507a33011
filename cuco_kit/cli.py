"""`cuco`: the headless command line. Each subcommand is a thin call into the engine's Python API.

Commands live in `cuco_kit.commands`, one module each (`HELP`, `add_arguments`, `run`). Only the module of the
command that runs is imported, so `cuco check` does not pay for torch, and a missing optional dependency is
reported for the command that needs it only.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import NoReturn

from cuco_kit.errors import CucoError
from cuco_kit.terminal import one_line

# Command name -> its module, in the order `cuco --help` lists them.
COMMANDS: dict[str, str] = {
    "check": "cuco_kit.commands.check",
    "analyze": "cuco_kit.commands.analyze",
    "eval": "cuco_kit.commands.eval",
    "fastpath": "cuco_kit.commands.fastpath",
    "search": "cuco_kit.commands.search",
    "init": "cuco_kit.commands.init",
    "check-workload": "cuco_kit.commands.check_workload",
    "bundle": "cuco_kit.commands.bundle",
    "open": "cuco_kit.commands.open",
    "fake-llm": "cuco_kit.commands.fake_llm",
}


def _command(name: str) -> ModuleType:
    return importlib.import_module(COMMANDS[name])


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (what was wrong, where to look), exit code 2 as usual."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def build_parser(names: Iterable[str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser with a subcommand for each of `names` (every command by default)."""
    parser = _Parser(prog="cuco", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in names:
        module = _command(name)
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        print(f"cuco: unknown command {one_line(repr(argv[0]))}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # A command line naming a command needs that command's parser only; `cuco` and `cuco --help` list them all.
    parser = build_parser([argv[0]] if argv and argv[0] in COMMANDS else COMMANDS)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(_command(args.command).run(args) or 0)
    except CucoError as exc:
        # One line, whatever the message quotes (a file name, a candidate's text, an LLM's answer).
        print(f"cuco {args.command}: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cuco {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
