"""Labelled FIXTURE scripts for the fake OpenAI-compatible server: which recorded answer goes to which prompt.

Each road a newcomer walks without a model (the fast path on the main sample, gemm_allgather; the import and the
fast path of the example program, cuco_kit/importer/examples/allreduce_norm.cu) gets one script. Answers are
chosen by what the prompt asks, never by call order, so a Reject cannot shift them: each stage (Stage A, Stage B,
annotate; port, reference) has a first answer and a retry answer for the prompt that carries the failed attempts
or a person's note. A fixture cannot read a note, so a retry answer says it repeats (or corrects) the recorded
one. Every answer starts with "FIXTURE"; the server names each one "fixture-<entry>" (llm/fake_server.py).
"""
from __future__ import annotations

from collections.abc import Callable

from cuco_kit.llm import fixtures
from cuco_kit.llm.fake_server import Scripted, answer

# What the prompts say (cuco_kit/prompts/*.md, fastpath/pipeline.py, importer/session.py).
STAGE_PROMPTS = (("stage-a", "# Stage A"), ("stage-b", "# Stage B"), ("annotate", "# Annotate"))
FASTPATH_RETRY = "## Previous attempts that failed"  # the fast path's prompt after a failed or rejected attempt
IMPORT_NOTE = "A person's note on the previous answer"  # the import's prompt after a rejected draft
PORT_PROMPT = "Port a host-driven program"
REFERENCE_PROMPT = "Write the torch reference"
JUDGE_PROMPT = "Diagnose the failure"

GEMM_FASTPATH = {"stage-a": "gemm_stage_a.cu", "stage-b": "gemm_stage_b_lsa.cu", "annotate": "gemm_annotated.cu"}
EXAMPLE_FASTPATH = {"stage-a": "own_norm_stage_a.cu", "stage-b": "own_norm_stage_b_lsa.cu",
                    "annotate": "own_norm_annotated.cu"}


def _block(preface: str, text: str, lang: str = "cuda") -> str:
    return f"{preface}\n\n```{lang}\n{text}```\n"


def fastpath_script(files: dict[str, str], origin: str) -> list[Scripted]:
    """Stage A, Stage B and annotate, each with a first answer and a retry answer (the same file: a fixture
    cannot follow a note), and a judge answer. `files`: stage entry -> fixture file; `origin`: what the answers
    are, said in each one."""
    out: list[Scripted] = []
    for name, prompt in STAGE_PROMPTS:
        code = fixtures.load(files[name])
        out.append(answer(name, _block(f"FIXTURE answer ({origin}, not a live model).", code), match=prompt,
                          absent=FASTPATH_RETRY, times=0))
        out.append(answer(f"{name}-retry", _block(
            f"FIXTURE retry answer ({origin}, not a live model): a fixture cannot read your note or the failed "
            "attempt, so this is the same recorded answer again.", code), match=[prompt, FASTPATH_RETRY], times=0))
    out.append(answer("judge", "FIXTURE diagnosis: no live model is answering in this run.", match=JUDGE_PROMPT,
                      times=0))
    return out


def gemm_fastpath() -> list[Scripted]:
    """The fast path on gemm_allgather's host-NCCL seed: answers a model gave, recorded."""
    return fastpath_script(GEMM_FASTPATH, "recorded")


def example_fastpath() -> list[Scripted]:
    """The fast path on the example program's imported seed: answers written for it."""
    return fastpath_script(EXAMPLE_FASTPATH, "written for the example program")


def example_import() -> list[Scripted]:
    """The import of the example program: a port that drops a buffer (to reject), then, once a note came back, a
    correct one; a reference."""
    origin = "FIXTURE answer (written for the example program, not a live model)."
    return [answer("port-drops-buffer", _block(origin, fixtures.load("own_norm_port_drops_buffer.cu")),
                   match=PORT_PROMPT, absent=IMPORT_NOTE, times=0),
            answer("port", _block("FIXTURE answer to your note (written for the example program, not a live "
                                  "model).", fixtures.load("own_norm_port.cu")),
                   match=[PORT_PROMPT, IMPORT_NOTE], times=0),
            answer("reference", _block(origin, fixtures.load("own_norm_reference.txt"), "python"),
                   match=REFERENCE_PROMPT, times=0)]


# road -> script, for `cuco fake-llm --script NAME`
SCRIPTS: dict[str, Callable[[], list[Scripted]]] = {
    "gemm_allgather": gemm_fastpath,
    "allreduce_norm": lambda: example_import() + example_fastpath(),
}
