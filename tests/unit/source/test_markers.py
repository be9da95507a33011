"""EVOLVE markers, the knob block and frozen hashing (cuco_kit.source.markers)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuco_kit.errors import BadInput
from cuco_kit.source import markers as B

DATA = Path(__file__).resolve().parents[2] / "data" / "l0"
PARENT = (DATA / "parent.cu").read_text()


# ------------------------------------------------------------------------------------------------ markers

def test_blocks_are_found_with_lines_and_text():
    found = B.blocks(PARENT)
    assert [b.name for b in found] == ["knobs", "kernels", "step"]
    lines = PARENT.split("\n")
    for b in found:
        assert "EVOLVE-BLOCK-START " + b.name in lines[b.start_line - 1]
        assert lines[b.end_line - 1].strip() == "// EVOLVE-BLOCK-END"
        assert PARENT[b.start_offset:b.end_offset] == b.text
        assert b.text == "".join(line + "\n" for line in lines[b.start_line:b.end_line - 1])


def test_marker_version_is_two():
    # 2: knob rules; a version-1 reader would take a `// knob-rule:` line for a comment and accept a broken point
    assert B.MARKER_VERSION == 2


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
@pytest.mark.parametrize("final_newline", [True, False])
def test_strip_markers_gives_back_the_plain_code_byte_for_byte(ending, final_newline):
    plain_lines = ["#include <x.h>", "int f() {", "  int a = 1;", "  return a;", "}", "int g();"]
    plain = ending.join(plain_lines) + (ending if final_newline else "")
    annotated_lines = (plain_lines[:2] + ["  // EVOLVE-BLOCK-START body"] + plain_lines[2:4]
                       + ["  // EVOLVE-BLOCK-END"] + plain_lines[4:5] + ["// EVOLVE-BLOCK-START tail"]
                       + plain_lines[5:] + ["// EVOLVE-BLOCK-END"])
    annotated = ending.join(annotated_lines) + (ending if final_newline else "")
    assert [b.name for b in B.blocks(annotated)] == ["body", "tail"]
    assert B.strip_markers(annotated) == plain


def test_strip_markers_of_the_sample_removes_exactly_the_marker_lines():
    stripped = B.strip_markers(PARENT)
    assert "EVOLVE-BLOCK" not in stripped
    assert len(PARENT.split("\n")) - len(stripped.split("\n")) == 2 * len(B.blocks(PARENT))


def test_empty_block_and_indented_markers():
    code = "int a;\n    // EVOLVE-BLOCK-START e\n    // EVOLVE-BLOCK-END\nint b;\n"
    (b,) = B.blocks(code)
    assert (b.name, b.start_line, b.end_line, b.text) == ("e", 2, 3, "")


@pytest.mark.parametrize("code, pattern", [
    ("a;\n// EVOLVE-BLOCK-START x\nb;\n", r"line 2: block 'x' is never closed"),
    ("a;\n// EVOLVE-BLOCK-END\n", r"line 2: EVOLVE-BLOCK-END without a matching"),
    ("// EVOLVE-BLOCK-START x\n// EVOLVE-BLOCK-START y\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-END\n",
     r"line 2: block 'y' starts inside block 'x' \(started at line 1\); blocks do not nest"),
    ("// EVOLVE-BLOCK-START x\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-START x\n// EVOLVE-BLOCK-END\n",
     r"line 3: block name 'x' is used twice \(first at line 1\)"),
    ("int v; // EVOLVE-BLOCK-START x\n// EVOLVE-BLOCK-END\n", r"line 1: .* must be alone on its line"),
    ("// EVOLVE-BLOCK-START x\nint v; // EVOLVE-BLOCK-END\n", r"line 2: .* must be alone on its line"),
    ("// EVOLVE-BLOCK-START x y\n// EVOLVE-BLOCK-END\n", r"line 1: .* must be alone on its line"),
    ("// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-START block_1\n// EVOLVE-BLOCK-END\n",
     r"line 3: block name 'block_1' is used twice \(first at line 1\)"),
    ("// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-START\n", r"line 2: block 'block_2' \(unnamed\) starts inside block"),
    ("// EVOLVE-BLOCK-START 9lives\n// EVOLVE-BLOCK-END\n", r"line 1: block name '9lives' is not an identifier"),
])
def test_malformed_markers_are_rejected_with_the_line(code, pattern):
    with pytest.raises(B.MarkerError, match=pattern):
        B.blocks(code)


def test_unnamed_blocks_in_cucos_style_are_named_by_their_place():
    # CUCo's and ShinkaEvolve's seeds mark their mutable regions without names
    code = ("#include <nccl.h>\n// EVOLVE-BLOCK-START\n__global__ void k(float* x) { x[0] = 1.f; }\n"
            "// EVOLVE-BLOCK-END\nint helper() { return 2; }\n// EVOLVE-BLOCK-START tuning\nconstexpr int kT = 4;\n"
            "// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-START\nvoid run() {}\n// EVOLVE-BLOCK-END\n")
    found = B.blocks(code)
    assert [(b.name, b.start_line, b.end_line, b.auto_named) for b in found] == [
        ("block_1", 2, 4, True), ("tuning", 6, 8, False), ("block_3", 9, 11, True)]
    assert [b.name for b in B.auto_named(found)] == ["block_1", "block_3"]
    assert B.naming_note(found) == ("unnamed EVOLVE blocks named by their place in the file: block_1 = lines 2-4, "
                                    "block_3 = lines 9-11")
    assert B.naming_note([b for b in found if not b.auto_named]) is None
    assert B.strip_markers(code).count("EVOLVE") == 0 and B.frozen_hash(code)  # read like any other markers


def test_marker_error_is_bad_input():
    assert issubclass(B.MarkerError, BadInput)


# ---------------------------------------------------------------------------------------------- frozen hash

def test_frozen_text_keeps_markers_and_drops_block_bodies():
    text = B.frozen_text(PARENT)
    assert "// EVOLVE-BLOCK-START step" in text and "// EVOLVE-BLOCK-END" in text
    assert "copy_chunk<<<" not in text  # launch sits in the step block
    assert "CUCO_EXPORT int cuco_step" in text


def test_frozen_hash_ignores_block_edits_and_sees_every_frozen_byte():
    h = B.frozen_hash(PARENT)
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    step = "  // EVOLVE-BLOCK-START step\n"
    assert B.frozen_hash(PARENT.replace(step, step + "  int unused_local = 0;\n")) == h
    assert B.frozen_hash(PARENT.replace("Release what", "Release  what")) == h  # no such text: unchanged
    assert B.frozen_hash(PARENT.replace("int ceil_div(int a", "int ceil_div(int  a")) != h
    assert B.frozen_hash(PARENT.replace("EVOLVE-BLOCK-START step", "EVOLVE-BLOCK-START steps")) != h
    assert B.frozen_hash(PARENT + "\n") != h
    assert B.frozen_hash(PARENT.replace("\n", "\r\n")) != h


# ---------------------------------------------------------------------------------------------------- knobs

def test_knob_block_is_parsed():
    ks = B.knobs(PARENT)
    assert [(k.name, k.type, k.value) for k in ks] == [
        ("kChunks", "int", "4"), ("kThreads", "int", "256"), ("kPlacement", "Placement", "Placement::kTwoStream")]
    assert ks[0].allowed == ("1", "2", "4", "8")
    assert ks[2].allowed == ("Placement::kSequential", "Placement::kTwoStream", "Placement::kFused")
    assert ks[0].line == PARENT[:PARENT.index("constexpr int kChunks")].count("\n") + 1


def test_allowed_sets_split_on_top_level_commas_only():
    code = ("// EVOLVE-BLOCK-START knobs\n"
            "static constexpr Tile kTile = Tile(64, 128); // knob: {Tile(64, 128), Tile(128, 128)}\n"
            "// EVOLVE-BLOCK-END\n")
    (k,) = B.knobs(code)
    assert k.allowed == ("Tile(64, 128)", "Tile(128, 128)") and k.value == "Tile(64, 128)"


def test_set_knobs_rewrites_values_only():
    new = B.set_knobs(PARENT, {"kChunks": 8, "kPlacement": "Placement::kFused"})
    assert {k.name: k.value for k in B.knobs(new)} == {
        "kChunks": "8", "kThreads": "256", "kPlacement": "Placement::kFused"}
    changed = [(a, b) for a, b in zip(PARENT.split("\n"), new.split("\n")) if a != b]
    assert len(changed) == 2 and len(new.split("\n")) == len(PARENT.split("\n"))
    assert B.frozen_hash(new) == B.frozen_hash(PARENT)


def test_set_knobs_validates():
    with pytest.raises(BadInput, match=r"knob kChunks = 3 is not in its allowed set \{1, 2, 4, 8\}"):
        B.set_knobs(PARENT, {"kChunks": 3})
    with pytest.raises(BadInput, match=r"unknown knob 'kNope'"):
        B.set_knobs(PARENT, {"kNope": 1})


def test_set_knobs_formats_bools():
    code = "// EVOLVE-BLOCK-START knobs\nconstexpr bool kFuse = false; // knob: {false, true}\n// EVOLVE-BLOCK-END\n"
    assert "kFuse = true;" in B.set_knobs(code, {"kFuse": True})


def test_design_cell_is_sorted_and_stable():
    ks = B.knobs(PARENT)
    cell = B.design_cell(ks)
    assert cell == "kChunks=4|kPlacement=Placement::kTwoStream|kThreads=256"
    assert B.design_cell(list(reversed(ks))) == cell
    assert B.design_cell({"kThreads": 256, "kPlacement": "Placement::kTwoStream", "kChunks": 4}) == cell
    assert B.design_cell({}) == "-"
    assert B.design_cell(B.knobs(B.set_knobs(PARENT, {"kChunks": 2}))) != cell


def test_knob_space_is_every_combination_in_file_order():
    space = B.knob_space(PARENT)
    assert len(space) == 4 * 3 * 3 and len({B.design_cell(kv) for kv in space}) == len(space)
    assert space[0] == {"kChunks": "1", "kThreads": "128", "kPlacement": "Placement::kSequential"}
    assert space[1] == {"kChunks": "1", "kThreads": "128", "kPlacement": "Placement::kTwoStream"}
    assert all(list(kv) == ["kChunks", "kThreads", "kPlacement"] for kv in space)
    assert B.knob_space(PARENT) == space  # stable


def test_knob_space_of_named_knobs_and_of_none():
    assert B.knob_space(PARENT, ["kPlacement", "kChunks"])[:2] == [
        {"kChunks": "1", "kPlacement": "Placement::kSequential"},
        {"kChunks": "1", "kPlacement": "Placement::kTwoStream"}]
    assert B.knob_space(PARENT, []) == [{}]
    assert B.knob_space("int x;\n") == [{}]
    with pytest.raises(BadInput, match=r"unknown knob\(s\) kNope; knobs: kChunks, kThreads, kPlacement"):
        B.knob_space(PARENT, ["kNope"])


def test_knobs_raises_bad_input_on_a_broken_knob_block():
    with pytest.raises(BadInput, match=r"knob kChunks = 5 is not in its allowed set"):
        B.knobs(PARENT.replace("kChunks = 4;", "kChunks = 5;"))
