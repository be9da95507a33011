"""`cuco fake-llm [--port N] [--road NAME]`: serve labelled FIXTURE answers on 127.0.0.1 as an OpenAI-compatible
server, so the terminal road (`cuco init --llm`, `cuco fastpath`, `cuco search --mutator llm`) can be walked
without a model.

The answers are fixtures (cuco_kit/llm/fixture_scripts.py), chosen by what each prompt asks: the example
program's import and fast path, gemm_allgather's recorded fast path (for any other program too, where they fail
its checks, as a wrong answer would), and knob moves for the search. Every answer says it is a fixture and the
server names each one "fixture-<entry>". It serves until Ctrl-C (or SIGTERM), on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.llm.fake_server import FakeOpenAIServer
from cuco_kit.llm.fixture_scripts import SCRIPTS

HELP = "serve FIXTURE LLM answers on 127.0.0.1 (OpenAI-compatible), to try the LLM commands without a model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one, printed)")
    parser.add_argument("--road", choices=sorted(SCRIPTS), default="all",
                        help="which fixture answers to serve (default: all the docs' roads)")


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise BadInput(f"--port {args.port}: use 0 (a free port) or a port number up to 65535")
    server = FakeOpenAIServer(SCRIPTS[args.road](), port=args.port)
    try:
        server.start()
    except OSError as exc:
        raise BadInput(f"cuco fake-llm: cannot listen on 127.0.0.1:{args.port} ({exc.strerror}); pick another "
                       "--port, or 0 for a free one") from None
    stop = threading.Event()

    def _stop(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    env = server.env()
    print(f"cuco fake-llm: serving FIXTURE answers ({args.road}: written for the docs' samples or recorded, NOT a "
          f"live model) on {server.base_url}", flush=True)
    print("point the LLM commands at it, in another terminal:", flush=True)
    print("  export " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    print("Ctrl-C stops it.", flush=True)
    try:
        stop.wait()
    finally:
        served = len(server.chat_requests())
        server.stop()
    print(f"cuco fake-llm: stopped after {served} chat request(s), every one answered with a fixture or refused",
          flush=True)
    return 0
