"""The fault corpus: bad inputs of every kind the kit takes -- command-line flags, files, workload folders, import
plans, models files and the environment -- each run through `cuco` in this process (a few through `python -m
cuco_kit`, where the process's own exit matters). Every case ends in one of two ways and nothing else:

- refused: exit code 2 (an argparse error included) and exactly one line on stderr naming what was wrong, with
  every file the case made left as it was and no database created;
- a correct success: exit code 0 with the output that says what happened (or a report, exit 1, for `check` and
  `check-workload`, whose job is to list problems).

Never a traceback, a hang (pytest-timeout stops one; a workload that loops is given 1 s to load here), a silent
success on bad input, or a change to what the user gave.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuco_kit import workload as workload_module
from cuco_kit.cli import main
from cuco_kit.evaluate import gpu_evaluator
from cuco_kit.search.synthetic import BASELINE, write_synthetic_workload
from cuco_kit.store import Store

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "cuco_kit" / "importer" / "examples"
PROGRAM = EXAMPLES / "allreduce_norm.cu"
BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
NOT_UTF8 = b"\xff\xfe not utf-8 \xc3\x28\n"
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@dataclass
class Case:
    """``make(folder)`` writes what the case needs into its folder and returns the argv; ``says``: text the one
    error line (refused) or the output (success, report) must contain."""

    make: Callable[[Path], list[str]]
    says: str
    rc: int = 2
    env: dict[str, str] = field(default_factory=dict)


def wl(d: Path, *, workload_py: str | None = None, baseline: str | bytes | None = None,
       drop: tuple[str, ...] = ()) -> Path:
    """The synthetic workload in ``d/wl``, with its workload.py or baseline replaced, or files left out."""
    w = write_synthetic_workload(d / "wl")
    if workload_py is not None:
        (w / "workload.py").write_text(workload_py, encoding="utf-8")
    if isinstance(baseline, bytes):
        (w / "baseline.cu").write_bytes(baseline)
    elif baseline is not None:
        (w / "baseline.cu").write_text(baseline, encoding="utf-8")
    for name in drop:
        (w / name).unlink()
    return w


def search(d: Path, *extra: str, workload: Path | None = None) -> list[str]:
    return ["search", str(workload or wl(d)), "--db", str(d / "run.db"), "--evaluator", "simulated",
            "--generations", "1", *extra]


def file(d: Path, name: str, content: str | bytes) -> Path:
    p = d / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


def wl_py(body: str) -> str:
    """A workload.py whose WORKLOAD is the synthetic one with ``body`` applied (e.g. a field replaced)."""
    return WORKLOAD_HEAD + body


WORKLOAD_HEAD = '''
from pathlib import Path
from cuco_kit.workload import TensorSpec, Workload, Tolerance

def _ref(inputs, params, world):
    return [{"y": inputs[r]["x"]} for r in range(world)]

def make(**over):
    kw = dict(name="w", directory=Path(__file__).resolve().parent, description="d", params={"N": 4096},
              tensors=[TensorSpec("x", "input", "f32", shape=lambda p, w: (p["N"],)),
                       TensorSpec("y", "output", "f32", shape=lambda p, w: (p["N"],))],
              reference=_ref, seeds={"nccl": "seed_nccl.cu", "symm": "seed_nccl.cu"}, baseline="baseline.cu")
    kw.update(over)
    return Workload(**kw)
'''


def models(d: Path, raw: object) -> list[str]:
    text = raw if isinstance(raw, (str, bytes)) else json.dumps(raw)
    return search(d, "--models", str(file(d, "models.json", text)))


def plan(d: Path, content: str | bytes) -> list[str]:
    return ["init", str(PROGRAM), "--workload", str(d / "out"), "--plan", str(file(d, "plan.json", content))]


def knob_line(old: str, new: str) -> str:
    assert old in BASELINE
    return BASELINE.replace(old, new)


CASES: dict[str, Case] = {
    # ---- command-line flags -------------------------------------------------------------------------------
    "unknown command": Case(lambda d: ["frobnicate"], "unknown command 'frobnicate'"),
    "unknown flag": Case(lambda d: search(d, "--frobnicate"), "unrecognized arguments: --frobnicate"),
    "missing --db": Case(lambda d: ["search", str(wl(d))], "the following arguments are required: --db"),
    "generations not a number": Case(lambda d: search(d, "--generations", "ten"), "invalid int value: 'ten'"),
    "generations too many": Case(lambda d: search(d, "--generations", "10001"), "between 0 and 10000"),
    "generations negative": Case(lambda d: search(d, "--generations=-1"), "between 0 and 10000"),
    "seed negative": Case(lambda d: search(d, "--seed=-5"), "--seed -5: must be between 0 and 4294967295"),
    "seed huge": Case(lambda d: search(d, "--seed", str(2**64)), "must be between 0 and 4294967295"),
    "ranks zero": Case(lambda d: search(d, "--ranks", "0"), "--ranks 0: must be between 1 and 64"),
    "ranks too many": Case(lambda d: search(d, "--ranks", "65"), "--ranks 65: must be between 1 and 64"),
    "backend unknown": Case(lambda d: search(d, "--backend", "mpi"), "invalid choice: 'mpi'"),
    "mutator unknown": Case(lambda d: search(d, "--mutator", "genetic"), "invalid choice: 'genetic'"),
    "evaluator unknown": Case(lambda d: search(d, "--evaluator", "cpu"), "invalid choice: 'cpu'"),
    "size without value": Case(lambda d: search(d, "--size", "N"), "expected NAME=INTEGER"),
    "size not a number": Case(lambda d: search(d, "--size", "N=big"), "expected NAME=INTEGER"),
    "size negative": Case(lambda d: search(d, "--size", "N=-4"), "a size is an integer from 0"),
    "size beyond int64": Case(lambda d: search(d, "--size", "N=" + "9" * 30), "a size is an integer from 0"),
    "size unknown name": Case(lambda d: search(d, "--size", "M=4"), "unknown parameter 'M'"),
    "size zero": Case(lambda d: search(d, "--size", "N=0"), "sizes must make every dimension positive"),
    "size too large for a GPU": Case(lambda d: search(d, "--size", f"N={2**45}"), "GiB per rank"),
    "llm timeout zero": Case(lambda d: search(d, "--mutator", "llm", "--llm-timeout", "0"),
                             "--llm-timeout 0: must be more than 0"),
    "llm timeout nan": Case(lambda d: search(d, "--mutator", "llm", "--llm-timeout", "nan"),
                            "--llm-timeout nan: must be more than 0"),
    "llm timeout inf": Case(lambda d: search(d, "--mutator", "llm", "--llm-timeout", "inf"),
                            "--llm-timeout inf: must be more than 0"),
    "llm retries too many": Case(lambda d: search(d, "--mutator", "llm", "--llm-retries", "21"),
                                 "--llm-retries 21: must be between 0 and 20"),
    "llm budget negative": Case(lambda d: search(d, "--mutator", "llm", "--llm-budget=-1"),
                                "--llm-budget -1: must be more than 0"),
    "llm budget nan": Case(lambda d: search(d, "--mutator", "llm", "--llm-budget", "nan"),
                           "--llm-budget nan: must be more than 0"),
    "llm budget huge": Case(lambda d: search(d, "--mutator", "llm", "--llm-budget", "1e9"),
                            "at most 10000 dollars"),
    "llm token budget zero": Case(lambda d: search(d, "--mutator", "llm", "--llm-token-budget", "0"),
                                  "--llm-token-budget 0: must be more than 0"),
    "gpus with ray": Case(lambda d: search(d, "--executor", "ray", "--gpus", "0"), "--gpus applies to"),
    "ray address without ray": Case(lambda d: search(d, "--ray-address", "auto"), "--ray-address needs"),
    "gpus named twice": Case(lambda d: search(d, "--gpus", "0,1,0"), "GPU 0 is named twice"),
    "gpus empty": Case(lambda d: search(d, "--gpus", ","), "name at least one GPU"),
    "eval iters zero": Case(lambda d: ["eval", str(wl(d) / "baseline.cu"), "--workload", str(d / "wl"),
                                       "--iters", "0"], "--iters 0: must be between 1"),
    "eval iters huge": Case(lambda d: ["eval", str(wl(d) / "baseline.cu"), "--workload", str(d / "wl"),
                                       "--iters", "99999999999"], "--iters 99999999999: must be between 1"),
    "eval ranks huge": Case(lambda d: ["eval", str(wl(d) / "baseline.cu"), "--workload", str(d / "wl"),
                                       "--ranks", "10000"], "must be between 1 and 64"),
    "fastpath attempts zero": Case(lambda d: ["fastpath", str(wl(d) / "seed_nccl.cu"), "--max-attempts", "0"],
                                   "--max-attempts 0: must be between 1"),
    "fastpath attempts huge": Case(lambda d: ["fastpath", str(wl(d) / "seed_nccl.cu"), "--max-attempts",
                                              "100000"], "--max-attempts 100000: must be between 1"),

    # ---- files: candidates, results, databases ------------------------------------------------------------
    "check: no such candidate": Case(lambda d: ["check", str(d / "nope.cu")], "no such file"),
    "check: candidate is a folder": Case(lambda d: ["check", str(d)], "not a regular file"),
    "check: binary candidate": Case(lambda d: ["check", str(file(d, "c.cu", BINARY))], "is binary"),
    "check: non-UTF-8 candidate": Case(lambda d: ["check", str(file(d, "c.cu", NOT_UTF8))], "is not UTF-8 text"),
    "check: empty candidate": Case(lambda d: ["check", str(file(d, "c.cu", ""))], "is empty"),
    "check: huge candidate": Case(lambda d: ["check", str(_sparse(d / "c.cu", 17 << 20))], "is too large"),
    "check: unclosed block": Case(lambda d: ["check", str(file(d, "c.cu", "int x;\n// EVOLVE-BLOCK-START a\n"))],
                                  "block 'a' is never closed"),
    "check: block named twice": Case(lambda d: ["check", str(file(d, "c.cu", (
        "int x;\n// EVOLVE-BLOCK-START a\nint y;\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-START a\nint z;\n"
        "// EVOLVE-BLOCK-END\n")))], "is used twice"),
    "check: missing parent": Case(lambda d: ["check", str(wl(d) / "baseline.cu"), "--parent", str(d / "p.cu")],
                                  "parent", ),
    "check: knob outside its set": Case(lambda d: ["check", str(file(d, "c.cu", knob_line(
        "constexpr int kChunks = 2;", "constexpr int kChunks = 3;"))), "--parent", str(wl(d) / "baseline.cu")],
        "knob kChunks = 3 is not in its allowed set", rc=1),
    "check: a good candidate": Case(lambda d: ["check", str(wl(d) / "baseline.cu")], "accepted: 2 EVOLVE block",
                                    rc=0),
    "analyze: binary file": Case(lambda d: ["analyze", str(file(d, "a.cu", BINARY))], "looks binary"),
    "analyze: no such file": Case(lambda d: ["analyze", str(d / "a.cu")], "no such file"),
    "eval: no such candidate": Case(lambda d: ["eval", str(d / "nope.cu"), "--workload", str(wl(d))],
                                    "no such file"),
    "eval: binary candidate": Case(lambda d: ["eval", str(file(d, "c.cu", BINARY)), "--workload", str(wl(d))],
                                   "is binary"),
    "from: no such file": Case(lambda d: search(d, "--from", str(d / "r.cu")), "--from"),
    "from: binary": Case(lambda d: search(d, "--from", str(file(d, "r.cu", BINARY))), "is binary"),
    "from: no blocks": Case(lambda d: search(d, "--from", str(file(d, "r.cu", "int main() { return 0; }\n"))),
                            "no EVOLVE blocks"),
    "from: unclosed block": Case(lambda d: search(d, "--from", str(file(d, "r.cu", "int x;\n"
                                                                      "// EVOLVE-BLOCK-START k\n"))),
                                 "is never closed"),
    "from: knob outside its set": Case(lambda d: search(d, "--from", str(file(d, "r.cu", knob_line(
        "constexpr int kThreads = 256;", "constexpr int kThreads = 100;")))), "is not in its allowed set"),
    "db: folder missing": Case(lambda d: ["search", str(wl(d)), "--db", str(d / "no" / "run.db"), "--evaluator",
                                          "simulated"], "does not exist"),
    "db: is a folder": Case(lambda d: ["search", str(wl(d)), "--db", str(d), "--evaluator", "simulated"],
                            "store"),
    "db: not SQLite": Case(lambda d: search(d, workload=_with_db(d, b"not a database\n" * 50)),
                           "not a SQLite file"),
    "db: foreign SQLite": Case(lambda d: search(d, workload=_with_foreign_db(d)), "none of a cuco store"),
    "db: newer schema": Case(lambda d: search(d, workload=_with_future_db(d)), "newer than this cuco_kit"),
    "db: two hard links": Case(lambda d: search(d, workload=_with_linked_db(d)), "2 names (hard links)"),

    # ---- workload folders ---------------------------------------------------------------------------------
    "workload: no such folder": Case(lambda d: ["search", str(d / "nowhere"), "--db", str(d / "run.db")],
                                     "not a workload directory"),
    "workload: a file": Case(lambda d: ["search", str(file(d, "w.txt", "x")), "--db", str(d / "run.db")],
                             "not a workload directory"),
    "workload: no workload.py": Case(lambda d: search(d, workload=wl(d, drop=("workload.py",))),
                                     "not a workload directory"),
    "workload: syntax error": Case(lambda d: search(d, workload=wl(d, workload_py="WORKLOAD = (\n")),
                                   "cannot be loaded: line 1"),
    "workload: not UTF-8": Case(lambda d: search(d, workload=_wl_bytes(d, NOT_UTF8)), "cannot be loaded"),
    "workload: raises": Case(lambda d: search(d, workload=wl(d, workload_py="raise RuntimeError('no table')\n")),
                             "line 1: RuntimeError: no table"),
    "workload: sys.exit(0)": Case(lambda d: search(d, workload=wl(d, workload_py="import sys\nsys.exit(0)\n")),
                                  "it called sys.exit(0)"),
    "workload: sys.exit(3)": Case(lambda d: ["eval", str(wl(d) / "baseline.cu"), "--workload", str(
        wl(d, workload_py="import sys\nsys.exit(3)\n"))], "it called sys.exit(3)"),
    "workload: raise SystemExit": Case(lambda d: ["check-workload", str(wl(d, workload_py="raise SystemExit\n")),
                                                  "--no-compile"], "it called sys.exit(None)", rc=1),
    "workload: loops forever": Case(lambda d: search(d, workload=wl(d, workload_py="while True:\n    pass\n")),
                                    "did not finish loading within 1 s"),
    "workload: loops, check-workload": Case(lambda d: ["check-workload", str(wl(d, workload_py=(
        "while True:\n    pass\n"))), "--no-compile"], "did not finish loading within 1 s", rc=1),
    "workload: waits forever": Case(lambda d: ["eval", str(wl(d) / "baseline.cu"), "--workload", str(
        wl(d, workload_py="import threading\nthreading.Event().wait()\n"))], "did not finish loading within 1 s"),
    "workload: GeneratorExit": Case(lambda d: search(d, workload=wl(d, workload_py="raise GeneratorExit\n")),
                                    "line 1: GeneratorExit"),
    "workload: KeyboardInterrupt": Case(lambda d: search(d, workload=wl(d, workload_py="raise KeyboardInterrupt\n")),
                                        "interrupted", rc=130),
    "workload: no WORKLOAD": Case(lambda d: search(d, workload=wl(d, workload_py="X = 1\n")),
                                  "defines no WORKLOAD"),
    "workload: WORKLOAD of the wrong type": Case(lambda d: search(d, workload=wl(d, workload_py="WORKLOAD = 5\n")),
                                                 "defines no WORKLOAD"),
    "workload: unknown dtype": Case(lambda d: search(d, workload=wl(d, workload_py=wl_py(
        "WORKLOAD = make(tensors=[TensorSpec('x', 'input', 'f128', shape=lambda p, w: (4,))])\n"))),
        "unknown dtype 'f128'"),
    "workload: unknown timing": Case(lambda d: search(d, workload=wl(d, workload_py=wl_py(
        "WORKLOAD = make(timing='wall')\n"))), "timing 'wall'"),
    "workload: shape raises": Case(lambda d: search(d, workload=wl(d, workload_py=wl_py(
        "WORKLOAD = make(tensors=[TensorSpec('x', 'input', 'f32', shape=lambda p, w: (p['missing'],))])\n"))),
        "has no shape for"),
    "workload: negative shape": Case(lambda d: search(d, workload=wl(d, workload_py=wl_py(
        "WORKLOAD = make(tensors=[TensorSpec('x', 'input', 'f32', shape=lambda p, w: (-p['N'],))])\n"))),
        "sizes must make every dimension positive"),
    "workload: no baseline": Case(lambda d: search(d, workload=wl(d, workload_py=wl_py(
        "WORKLOAD = make(baseline=None)\n"))), "no baseline (the device-initiated program with the knob "
        "block) to start the search from; pass --from RESULT.cu"),
    "baseline: missing": Case(lambda d: search(d, workload=wl(d, drop=("baseline.cu",))), "no such file"),
    "baseline: empty": Case(lambda d: search(d, workload=wl(d, baseline="")), "no EVOLVE blocks"),
    "baseline: binary": Case(lambda d: search(d, workload=wl(d, baseline=BINARY)), "is binary"),
    "baseline: broken markers": Case(lambda d: search(d, workload=wl(d, baseline=BASELINE.replace(
        "// EVOLVE-BLOCK-END\n\nstruct", "\nstruct", 1))), "starts inside block 'knobs'"),
    "baseline: no blocks": Case(lambda d: search(d, workload=wl(d, baseline="int x = 1;\n")), "no EVOLVE blocks"),
    "baseline: knob outside its set": Case(lambda d: search(d, workload=wl(d, baseline=knob_line(
        "constexpr int kThreads = 256;", "constexpr int kThreads = 100;"))), "is not in its allowed set"),
    "baseline: knobs outside the knob block": Case(lambda d: search(d, workload=wl(d, baseline=BASELINE.replace(
        "// EVOLVE-BLOCK-START knobs", "// EVOLVE-BLOCK-START settings"))), "outside the knob block"),
    "baseline: no knob block, offline": Case(lambda d: search(d, workload=wl(d, baseline=(
        "int x;\n// EVOLVE-BLOCK-START kernel\nint y = 1;\n// EVOLVE-BLOCK-END\n"))), "has no knob block"),
    "seed: missing": Case(lambda d: search(d, workload=wl(d, drop=("seed_nccl.cu",))), "no such file"),
    "check-workload: a report of what is missing": Case(lambda d: ["check-workload", str(wl(d)), "--no-compile"],
                                                        "2 thing(s) to fix", rc=1),

    # ---- import plans (cuco init) ---------------------------------------------------------------------------
    "plan: no such file": Case(lambda d: ["init", str(PROGRAM), "--workload", str(d / "out"), "--plan",
                                          str(d / "plan.json")], "--plan"),
    "plan: binary": Case(lambda d: plan(d, BINARY), "is binary, not a JSON import plan"),
    "plan: not UTF-8": Case(lambda d: plan(d, NOT_UTF8), "is not UTF-8 text"),
    "plan: not JSON": Case(lambda d: plan(d, "{version: 1"), "not JSON"),
    "plan: a JSON list": Case(lambda d: plan(d, "[1, 2]"), "expected a JSON object"),
    "plan: wrong version": Case(lambda d: plan(d, '{"version": 99}'), "plan version 99"),
    "plan: unknown field": Case(lambda d: plan(d, '{"version": 2, "colour": "red"}'), "unknown field(s) colour"),
    "plan: nested too deeply": Case(lambda d: plan(d, DEEP_JSON), "plan"),
    "plan: a folder": Case(lambda d: ["init", str(PROGRAM), "--workload", str(d / "out"), "--plan", str(d)],
                           "not a regular file"),
    "init: workload is a file": Case(lambda d: ["init", str(PROGRAM), "--workload", str(file(d, "w", "x"))],
                                     "is a file, not a folder"),
    "init: workload under a file": Case(lambda d: ["init", str(PROGRAM), "--workload",
                                                   str(file(d, "w", "x") / "sub")], "which is a file"),
    "init: no such program": Case(lambda d: ["init", str(d / "p.cu"), "--workload", str(d / "out")],
                                  "no such file"),
    "init: binary program": Case(lambda d: ["init", str(file(d, "p.cu", BINARY)), "--workload", str(d / "out")],
                                 "is binary"),
    "init: a program without NCCL": Case(lambda d: ["init", str(ROOT / "tests" / "data" / "own_kernel" /
                                                                "no_nccl.cu"), "--workload", str(d / "out")],
                                         "NCCL"),
    "init: workload.py there already": Case(lambda d: ["init", str(PROGRAM), "--workload", str(wl(d))],
                                            "--force"),

    # ---- models files (--models) ------------------------------------------------------------------------------
    "models: no such file": Case(lambda d: search(d, "--models", str(d / "m.json")), "no such file"),
    "models: binary": Case(lambda d: models(d, BINARY), "is binary, not a JSON models file"),
    "models: not UTF-8": Case(lambda d: models(d, NOT_UTF8), "is not UTF-8 text"),
    "models: not JSON": Case(lambda d: models(d, "{mutation: []"), "not JSON"),
    "models: a JSON list": Case(lambda d: models(d, [1]), "must hold a JSON object"),
    "models: nested too deeply": Case(lambda d: models(d, DEEP_JSON), "--models"),
    "models: unknown key": Case(lambda d: models(d, {"mutaton": ["gpt-4o"]}), "unknown key(s) 'mutaton'"),
    "models: unknown model key": Case(lambda d: models(d, {"mutation": [{"name": "m", "temprature": 0}]}),
                                      "model m: unknown key(s) 'temprature'"),
    "models: mutation a string": Case(lambda d: models(d, {"mutation": "gpt-4o"}), "must be a list of models"),
    "models: a model without a name": Case(lambda d: models(d, {"mutation": [{"price": [1, 2]}]}),
                                           "a model is its name or an object with a 'name'"),
    "models: a model as a number": Case(lambda d: models(d, {"mutation": [7]}), "a model is its name"),
    "models: empty name": Case(lambda d: models(d, {"mutation": [""]}), "a model needs a name"),
    "models: price of one number": Case(lambda d: models(d, {"mutation": [{"name": "m", "price": 3}]}),
                                        "price must be [input, output]"),
    "models: price of words": Case(lambda d: models(d, {"mutation": [{"name": "m", "price": ["a", "b"]}]}),
                                   "price must be [input, output]"),
    "models: negative price": Case(lambda d: models(d, {"mutation": [{"name": "m", "price": [-1, 2]}]}),
                                   "finite and >= 0"),
    "models: send_temperature a word": Case(lambda d: models(d, {"mutation": [{"name": "m",
                                                                                "send_temperature": "no"}]}),
                                            "send_temperature must be true or false"),
    "models: context_tokens a word": Case(lambda d: models(d, {"mutation": [{"name": "m",
                                                                            "context_tokens": "big"}]}),
                                          "context_tokens must be a whole number"),
    "models: reasoning effort unknown": Case(lambda d: models(d, {"mutation": [{"name": "m",
                                                                               "reasoning_effort": "max"}]}),
                                             "reasoning_effort 'max'"),
    "models: the same model twice": Case(lambda d: models(d, {"mutation": ["m", "m"]}), "distinct names"),
    "models: bandit_c a word": Case(lambda d: models(d, {"bandit_c": "x"}), "bandit_c must be a number"),
    "models: a good file": Case(lambda d: models(d, {"mutation": [{"name": "m", "price": [1, 2]}]}),
                                "finished (generation budget reached (1 of 1))", rc=0),

    # ---- the environment --------------------------------------------------------------------------------------
    "env: LLM URL not http": Case(lambda d: search(d, "--mutator", "llm"), "is not an http(s) URL",
                                  env={"OPENAI_BASE_URL": "ftp://example.invalid/v1", "CUCO_MODEL": "m"}),
    "env: LLM URL nothing listening": Case(lambda d: search(d, "--mutator", "llm"), "LLM",
                                           env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "CUCO_MODEL": "m"}),
    "env: replay database junk": Case(lambda d: search(d, "--evaluator", "replay", workload=_with_replay_junk(d)),
                                      "replay.db cannot be opened as SQLite"),
    "env: replay database missing": Case(lambda d: search(d, "--evaluator", "replay"),
                                         "CUCO_REPLAY_DB=/nonexistent/replay.db: no such file",
                                         env={"CUCO_REPLAY_DB": "/nonexistent/replay.db"}),
    "env: no recording": Case(lambda d: search(d, "--evaluator", "replay"), "no recording of"),
    "env: TMPDIR missing": Case(lambda d: search(d), "finished (generation budget reached (1 of 1))", rc=0,
                                env={"TMPDIR": "/nonexistent/tmp"}),
    "env: a search that works": Case(lambda d: search(d), "finished (generation budget reached (1 of 1))", rc=0),
    "env: zero generations": Case(lambda d: search(d, "--generations", "0"),
                                  "finished (generation budget reached (0 of 0))", rc=0),
}


def _sparse(p: Path, size: int) -> Path:
    with p.open("wb") as f:
        f.truncate(size)  # a hole: the size says "huge" without writing it
    return p


def _wl_bytes(d: Path, content: bytes) -> Path:
    w = wl(d)
    (w / "workload.py").write_bytes(content)
    return w


def _with_db(d: Path, content: bytes) -> Path:
    (d / "run.db").write_bytes(content)
    return wl(d)


def _with_foreign_db(d: Path) -> Path:
    import sqlite3

    conn = sqlite3.connect(d / "run.db")
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    return wl(d)


def _with_future_db(d: Path) -> Path:
    import sqlite3

    Store(d / "run.db").close()
    conn = sqlite3.connect(d / "run.db")
    conn.execute("INSERT INTO schema_version VALUES (999, 0)")
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.commit()
    conn.close()
    return wl(d)


def _with_linked_db(d: Path) -> Path:
    Store(d / "run.db").close()
    os.link(d / "run.db", d / "backup.db")
    return wl(d)


def _with_replay_junk(d: Path) -> Path:
    w = wl(d)
    (w / "replay.db").write_bytes(b"junk" * 100)
    return w


def _files(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``d`` (bytecode caches aside): its bytes and mtime."""
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_the_corpus_is_large_and_covers_every_kind() -> None:
    kinds = {name.split(":")[0] for name in CASES if ":" in name}
    assert len(CASES) >= 100
    assert {"check", "eval", "from", "db", "workload", "baseline", "plan", "init", "models", "env"} <= kinds


@pytest.fixture(autouse=True)
def bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload_module, "LOAD_TIMEOUT_S", 1.0)

    def evaluate(self: object, request: object, progress: object = None) -> None:
        raise AssertionError("the GPU evaluator started on bad input")

    monkeypatch.setattr(gpu_evaluator.GpuEvaluator, "evaluate", evaluate)
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CUCO_MODEL", "CUCO_REPLAY_DB"):
        monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_or_a_correct_success(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    argv = case.make(tmp_path)
    db_before = (tmp_path / "run.db").exists()
    before = _files(tmp_path)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors exit
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    assert rc == case.rc, f"exit {rc}: {out[-500:]} {err[-500:]}"
    if rc in (2, 130):
        lines = err.strip().splitlines()
        assert len(lines) == 1 and case.says in lines[0], err
        assert _files(tmp_path) == before, "a refused input changed what the user gave"
        assert (tmp_path / "run.db").exists() == db_before, "a refused search created its database"
    else:
        assert case.says in out + err, out[-1000:] + err[-1000:]
        if rc == 0 and argv[0] == "search":
            with Store(tmp_path / "run.db", readonly=True) as st:
                assert [r["state"] for r in st.runs()] == ["finished"]


# Where the process's own exit matters: the real entry point, its exit code and its streams.
@pytest.mark.parametrize("name, says", [
    ("workload: sys.exit(0)", "it called sys.exit(0)"),
    ("generations not a number", "invalid int value"),
    ("models: binary", "is binary"),
    ("plan: binary", "is binary"),
])
def test_through_the_entry_point(name: str, says: str, tmp_path: Path) -> None:
    argv = CASES[name].make(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CUCO_MODEL")}
    p = subprocess.run([sys.executable, "-m", "cuco_kit", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(env, PYTHONPATH=str(ROOT)))
    assert p.returncode == 2 and "Traceback" not in p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr
