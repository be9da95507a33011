"""The labelled fixture scripts answer by what a prompt asks, never by call order: a Reject (a retry prompt) gets
the stage's retry answer, and the next stage still gets its own answer."""
from __future__ import annotations

from cuco_kit.llm import fixture_scripts as fs
from cuco_kit.llm.fake_server import pick
from cuco_kit.prompts import render


def _stage_prompt(stage: str, retry: bool) -> str:
    head = {"stage-a": "# Stage A: add the device-side", "stage-b": "# Stage B (LSA): replace",
            "annotate": "# Annotate: mark the regions"}[stage]
    return head + "\n...code...\n" + ("\n## Previous attempts that failed (do not repeat them)\n### Attempt 1 "
                                      "(llm): rejected at human\nNote: keep the stream\n" if retry else "")


def test_a_rejected_attempt_gets_the_stage_retry_answer_and_later_stages_their_own():
    script = fs.gemm_fastpath()
    asked = [("stage-a", False), ("stage-a", True), ("stage-a", True), ("stage-b", False), ("annotate", False),
             ("stage-a", False)]  # the last: a second fast path against the same server starts fresh
    got = [pick(script, _stage_prompt(s, r)) for s, r in asked]
    assert [e.name if e else None for e in got] == ["stage-a", "stage-a-retry", "stage-a-retry", "stage-b",
                                                    "annotate", "stage-a"]
    assert all(e is not None and e.text.startswith("FIXTURE") for e in got)
    assert "cannot read your note" in got[1].text


def test_the_fast_path_prompts_carry_the_words_the_scripts_match():
    for name, needle in (("fastpath_stage_a", "# Stage A"), ("fastpath_stage_b_lsa", "# Stage B"),
                         ("fastpath_annotate", "# Annotate")):
        text = render(name, analysis="", api_context="", cookbook="", code="", history="")
        assert needle in text, name


def test_the_example_import_gets_the_good_port_only_after_a_note():
    script = fs.example_import()
    first = pick(script, "# Port a host-driven program to the candidate ABI\n...")
    again = pick(script, "# Port a host-driven program to the candidate ABI\n...\nA person's note on the previous "
                         "answer: you dropped gamma\n")
    assert first is not None and first.name == "port-drops-buffer"
    assert again is not None and again.name == "port"
    assert set(fs.SCRIPTS) == {"all", "gemm_allgather", "allreduce_norm", "search"}


def test_one_server_holds_every_road_apart():
    """The example program's prompts (its code names rms_norm) get its answers; any other program gets
    gemm_allgather's; a search diff moves the knob the parent has to the next value of its set."""
    script = fs.every_road()
    example = pick(script, _stage_prompt("stage-a", False) + "__global__ void rms_norm(...)")
    other = pick(script, _stage_prompt("stage-a", False) + "ncclAllReduce(grad, ...)")
    assert example is not None and example.name == "example-stage-a"
    assert other is not None and other.name == "stage-a"
    diff = pick(script, "# Task: improve the program with targeted edits\n```cuda\n"
                        "constexpr int kBlocks = 32;    // knob: {8, 16, 32, 64}\n```")
    assert diff is not None and "constexpr int kBlocks = 64;" in diff.text and diff.text.startswith("NAME:")
    assert all("FIXTURE" in e.text for e in script if e.kind == "text")
