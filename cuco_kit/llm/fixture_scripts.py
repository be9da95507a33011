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


def fastpath_script(files: dict[str, str], origin: str, *, program: str | None = None,
                    prefix: str = "") -> list[Scripted]:
    """Stage A, Stage B and annotate, each with a first answer and a retry answer (the same file: a fixture
    cannot follow a note), and a judge answer. `files`: stage entry -> fixture file; `origin`: what the answers
    are, said in each one; `program`: a name every prompt about this program carries (its code is in the
    prompt), so one server can hold several programs' answers; `prefix`: prepended to the entry names."""
    out: list[Scripted] = []
    only = [program] if program else []
    for name, prompt in STAGE_PROMPTS:
        code = fixtures.load(files[name])
        out.append(answer(prefix + name, _block(f"FIXTURE answer ({origin}, not a live model).", code),
                          match=[prompt, *only], absent=FASTPATH_RETRY, times=0))
        out.append(answer(f"{prefix}{name}-retry", _block(
            f"FIXTURE retry answer ({origin}, not a live model): a fixture cannot read your note or the failed "
            "attempt, so this is the same recorded answer again.", code), match=[prompt, FASTPATH_RETRY, *only],
            times=0))
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


# The search's prompts (cuco_kit/prompts/search_*.md).
DIFF_PROMPT = "improve the program with targeted edits"
BLOCKS_PROMPTS = ("rewrite the program's EVOLVE blocks", "combine the strengths of two programs")
META_PROMPT = "summarise what the search has learned"
REPAIR_PROMPTS = ("could not be applied", "did not compile", "Your proposal was not used")
# Knob lines of the search's starting points: gemm_allgather's baseline (device_lsa.cu) and the fast path's
# annotated results of both samples (gemm_annotated.cu, own_norm_annotated.cu share the kBlocks line). A diff
# answer moves one knob to the next value of its set, whichever value the parent has.
KNOB_CYCLES = (("constexpr int kChunks = {};  // knob: {{1, 2, 4, 8}}", (1, 2, 4, 8)),
               ("constexpr int kBlocks = {};    // knob: {{8, 16, 32, 64}}", (8, 16, 32, 64)))
# Whole knob blocks, for the prompts that ask for blocks: (a line only that program has, the block).
KNOB_BLOCKS = (
    ("Placement::kPersistent}", "constexpr Placement kPlacement = Placement::kPersistent;  // knob: "
     "{Placement::kSequential, Placement::kTwoStream, Placement::kPersistent}\nconstexpr Sync kSync = "
     "Sync::kChunkFlags;  // knob: {Sync::kBarrier, Sync::kChunkFlags}\nconstexpr Issuer kIssuer = Issuer::kWarp;"
     "  // knob: {Issuer::kThread, Issuer::kWarp, Issuer::kCta}\nconstexpr int kChunks = 2;  // knob: {1, 2, 4, 8}"),
    ("// knob: {128, 256, 512, 1024}", "constexpr int kBlocks = 64;    // knob: {8, 16, 32, 64}\n"
     "constexpr int kThreads = 512;  // knob: {128, 256, 512, 1024}"),
    ("// knob: {128, 256, 512}\n", "constexpr int kBlocks = 16;    // knob: {8, 16, 32, 64}\n"
     "constexpr int kThreads = 256;  // knob: {128, 256, 512}"),
)


def search_script() -> list[Scripted]:
    """`--mutator llm` on the docs' starting points: knob-move diffs, knob-block rewrites (full and crossover
    prompts), a meta summary; a repair or resample prompt gets an answer that says a fixture cannot repair."""
    head = "NAME: {}\nRATIONALE: FIXTURE answer (written for the docs' samples, not a live model): {}\nTAGS: {}\n"
    out: list[Scripted] = []
    for line, values in KNOB_CYCLES:
        for old, new in zip(values, values[1:] + values[:1]):
            out.append(answer(f"diff-{line.split()[2]}-{old}-to-{new}", head.format(
                f"{line.split()[2]} {old} to {new}", "moves one knob to the next value of its set.", "knobs")
                + f"<<<<<<< SEARCH\n{line.format(old)}\n=======\n{line.format(new)}\n>>>>>>> REPLACE\n",
                match=[DIFF_PROMPT, line.format(old)], times=0))
    for i, (only, block) in enumerate(KNOB_BLOCKS):
        text = head.format("another knob setting", "another point of the knob block's design space.", "knobs") \
            + f"```cuda\n// EVOLVE-BLOCK-START knobs\n{block}\n// EVOLVE-BLOCK-END\n```\n"
        out += [answer(f"blocks-{i}-{p.split()[0]}", text, match=[p, only], times=0) for p in BLOCKS_PROMPTS]
    out.append(answer("meta", "- FIXTURE summary (not a live model): no lessons are drawn from fixture answers.",
                      match=META_PROMPT, times=0))
    out += [answer(f"repair-{i}", "FIXTURE answer (not a live model): a fixture cannot repair an answer or "
                   "think of another; nothing to apply.", match=p, times=0) for i, p in enumerate(REPAIR_PROMPTS)]
    return out


def every_road() -> list[Scripted]:
    """Every road the docs walk, on one server: the example program's import and fast path (its prompts name
    rms_norm), the fast path of any other program with gemm_allgather's recorded answers, and the search."""
    return (example_import() + fastpath_script(EXAMPLE_FASTPATH, "written for the example program",
                                               program="rms_norm", prefix="example-")
            + gemm_fastpath() + search_script())


# road -> script, for `cuco fake-llm --road NAME`
SCRIPTS: dict[str, Callable[[], list[Scripted]]] = {
    "all": every_road,
    "gemm_allgather": gemm_fastpath,
    "allreduce_norm": lambda: example_import() + example_fastpath(),
    "search": search_script,
}
