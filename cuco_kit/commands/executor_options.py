"""Where `cuco search` evaluates: the flags (--executor, --gpus, --ray-address), their checks and the executor
they make, plus the live log lines that say which slot evaluates what.

Local (the default): with the GPU evaluator, one slot per GPU set of this host's GPUs (--gpus, default all that
nvidia-smi lists); with the simulated or replay evaluator, --gpus names fake GPUs (tests, demos), and without it
one evaluator runs in this process as before. Ray: evaluator actors on the cluster's GPUs (--gpus does not apply:
Ray places them). Every problem is one line before the search starts.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.device import detect_gpu
from cuco_kit.evaluate.spec import EvaluatorSpec
from cuco_kit.events import Event
from cuco_kit.search.gpu_sets import parse_gpu_list
from cuco_kit.search.ray_executor import ray_executor
from cuco_kit.search.slot_board import SlotBoard
from cuco_kit.search.slots import SlotExecutor, local_executor
from cuco_kit.terminal import clean


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("where evaluations run")
    g.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: slots on this host's GPUs; ray: evaluator actors on a Ray cluster's GPUs")
    g.add_argument("--gpus", help="this host's GPUs to evaluate on, e.g. 0,1,2,3 (default: all that nvidia-smi "
                                  "lists); with --evaluator simulated or replay, names of fake GPUs for the slots")
    g.add_argument("--ray-address", help="with --executor ray: auto (the cluster this machine belongs to) or "
                                         "HOST:PORT; default: a private Ray cluster of this machine on 127.0.0.1")


def check_executor_arguments(args: argparse.Namespace) -> None:
    if args.executor == "ray" and args.gpus:
        raise BadInput("--gpus applies to --executor local; on Ray the cluster's GPU resources place the actors")
    if args.executor != "ray" and args.ray_address:
        raise BadInput("--ray-address needs --executor ray")
    if args.gpus is not None:
        parse_gpu_list(args.gpus)


def _host_gpus(wanted: str | None) -> list[str]:
    """The GPU evaluator's GPUs: --gpus, each one nvidia-smi lists (by index or UUID), or all it lists."""
    listed = detect_gpu()
    names = {g.get("index") for g in listed} | {g.get("uuid") for g in listed}
    if wanted is None:
        return [g["index"] for g in listed]
    gpus = parse_gpu_list(wanted)
    unknown = [g for g in gpus if g not in names]
    if unknown:
        have = ",".join(g["index"] for g in listed) or "none"
        raise BadInput(f"--gpus {wanted}: GPU {', '.join(unknown)} is not on this machine (nvidia-smi lists {have})")
    return gpus


def make_executor(args: argparse.Namespace, spec: EvaluatorSpec, workload_dir: str) -> SlotExecutor | None:
    """The executor the flags ask for; None: one evaluator in this process (no --gpus, no GPU evaluator)."""
    if args.executor == "ray":
        return ray_executor(spec, args.ranks, args.backend, address=args.ray_address, workload_dir=workload_dir)
    if spec.kind == "gpu":
        return local_executor(spec, _host_gpus(args.gpus), args.ranks, args.backend)
    if args.gpus is None:
        return None
    return local_executor(spec, parse_gpu_list(args.gpus), args.ranks, args.backend)


def slot_printer(out: TextIO) -> Callable[[Event], None]:
    """An event subscriber that writes a line when a slot starts an evaluation (with the slot's throughput so
    far) or loses one."""
    board = SlotBoard()

    def show(event: Event) -> None:
        line = board.on_event(event)
        if line is not None:
            tqdm.write(clean(line), file=out)  # names come from the LLM
            out.flush()

    return show
