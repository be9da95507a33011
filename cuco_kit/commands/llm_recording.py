"""The `--record DIR` / `--replay DIR` flags of the LLM-using commands (`cuco search`, `cuco fastpath`): every LLM
call and its answer kept in DIR/llm_calls.jsonl, or answered from it without a server, so a run made against a
real model can be replayed anywhere (cuco_kit.llm.replay.CallLog). Not a command itself.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from cuco_kit.errors import BadInput
from cuco_kit.llm import CallLog, LLMError
from cuco_kit.llm.replay import RECORDING_FILE


def add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LLM record / replay").add_mutually_exclusive_group()
    g.add_argument("--record", type=Path, metavar="DIR",
                   help=f"append every LLM call and its answer to DIR/{RECORDING_FILE} (for --replay)")
    g.add_argument("--replay", type=Path, metavar="DIR",
                   help=f"answer every LLM call from DIR/{RECORDING_FILE} (made with --record); no server is asked, "
                        "and a call the recording lacks stops the run")


def call_log(args: argparse.Namespace) -> CallLog | None:
    """The CallLog the flags ask for (None: neither flag). BadInput (one line) for a folder that cannot serve."""
    record, replay = getattr(args, "record", None), getattr(args, "replay", None)
    try:
        if replay is not None:
            return CallLog.replay(replay)
        if record is not None:
            if not Path(record).resolve().parent.is_dir():
                raise BadInput(f"--record {record}: folder {Path(record).parent} does not exist; create it first")
            return CallLog.record(record)
    except LLMError as exc:
        flag = "--replay" if replay is not None else "--record"
        raise BadInput(f"{flag}: {exc}") from None
    return None


def replay_miss(log: CallLog | None) -> str | None:
    """One line naming the first call a replay could not answer; None when every call was answered."""
    if log is None or not log.misses:
        return None
    return log.misses[0]
