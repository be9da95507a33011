"""SEARCH/REPLACE edits, full rewrites, code-fence extraction and diff data (cuco_kit.source.patch)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cuco_kit.source import markers, static_check
from cuco_kit.source.patch import (
    DiffRow,
    Edit,
    PatchError,
    apply_edits,
    apply_proposal,
    diff_rows,
    extract_code_block,
    parse_edits,
    unified_diff,
)

PARENT = (Path(__file__).resolve().parents[2] / "data" / "l0" / "parent.cu").read_text()


def edit_text(*pairs: tuple[str, str]) -> str:
    parts = ["Here is my change.\n"]
    for search, replace in pairs:
        parts.append(f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n")
        parts.append("And another one:\n")
    return "".join(parts)


def test_parse_edits_reads_several_in_order():
    text = edit_text(("a = 1;", "a = 2;"), ("  b();\n  c();", "  d();"))
    assert parse_edits(text) == [Edit("a = 1;", "a = 2;"), Edit("  b();\n  c();", "  d();")]
    assert parse_edits("no edits here") == []


def test_parse_edits_allows_an_empty_replace():
    text = "<<<<<<< SEARCH\n  x();\n=======\n>>>>>>> REPLACE\n"
    assert parse_edits(text) == [Edit("  x();", "")]


def test_edits_inside_blocks_apply_and_pass_l0():
    answer = edit_text(
        ("    CUDA_OK(cudaStreamWaitEvent(ctx->stream, s->ev[c], 0));",
         "    if (st != ctx->stream) CUDA_OK(cudaStreamWaitEvent(ctx->stream, s->ev[c], 0));"),
        ("  __threadfence_system();", "  __threadfence();"))
    new = apply_proposal(PARENT, answer)
    assert "if (st != ctx->stream) CUDA_OK" in new and "  __threadfence();" in new
    assert "__threadfence_system" not in new
    assert markers.frozen_hash(new) == markers.frozen_hash(PARENT)
    assert static_check.check_candidate(new, PARENT).ok


def test_edits_apply_in_sequence():
    # The second edit matches text the first one wrote.
    new = apply_edits(PARENT, [Edit("  __threadfence_system();", "  __threadfence(); // once"),
                               Edit("  __threadfence(); // once", "  __threadfence(); // twice")])
    assert "// twice" in new and "// once" not in new


def test_deleting_lines_leaves_no_blank_line():
    new = apply_edits(PARENT, [Edit("  __threadfence_system();", "")])
    assert len(new.split("\n")) == len(PARENT.split("\n")) - 1
    assert static_check.check_candidate(new, PARENT).ok


def test_search_not_found_names_the_edit():
    with pytest.raises(PatchError, match=r"^edit 2: SEARCH text not found \(first line 'does_not_exist\(\);'\)$"):
        apply_edits(PARENT, [Edit("  __threadfence_system();", "  __threadfence();"),
                             Edit("does_not_exist();", "x();")])


def test_search_not_found_hints_at_whitespace():
    with pytest.raises(PatchError, match=r"edit 1: SEARCH text not found .*matches line \d+ if whitespace is ignored"):
        apply_edits(PARENT, [Edit("\t__threadfence_system();", "\t__threadfence();")])


def test_ambiguous_search_is_rejected():
    with pytest.raises(PatchError, match=r"edit 1: SEARCH text matches \d+ times \(lines \d+, \d+.*\); add context"):
        apply_edits(PARENT, [Edit("s->ev[c]", "s->ev[0]")])


def test_search_outside_blocks_is_rejected():
    with pytest.raises(PatchError, match=r"edit 1: SEARCH text at line \d+ is not inside one EVOLVE block"):
        apply_edits(PARENT, [Edit("static int ceil_div(int a, int b)", "static int ceil_div2(int a, int b)")])


def test_search_spanning_a_marker_is_rejected():
    span = "  __threadfence_system();\n}\n// EVOLVE-BLOCK-END"
    assert span in PARENT
    with pytest.raises(PatchError, match=r"not inside one EVOLVE block"):
        apply_edits(PARENT, [Edit(span, "}")])


def test_replace_with_a_marker_is_rejected():
    with pytest.raises(PatchError, match=r"edit 1: the REPLACE text contains an EVOLVE marker"):
        apply_edits(PARENT, [Edit("  __threadfence_system();", "// EVOLVE-BLOCK-END\nint evil;")])


def test_empty_search_is_rejected():
    with pytest.raises(PatchError, match=r"edit 1: the SEARCH text is empty"):
        apply_edits(PARENT, [Edit("", "x")])


def test_full_rewrite_takes_the_last_cuda_block():
    answer = ("Old version:\n```cuda\nint old;\n```\nSome python:\n```python\nprint(1)\n```\n"
              f"New version:\n```cuda\n{PARENT}```\nDone.")
    assert apply_proposal("whatever", answer) == PARENT


def test_answer_with_neither_edits_nor_code_is_rejected():
    with pytest.raises(PatchError, match=r"no SEARCH/REPLACE edit and no ```cuda code block"):
        apply_proposal(PARENT, "I think it is fine as it is.")
    with pytest.raises(PatchError, match=r"no complete edit"):
        apply_proposal(PARENT, "<<<<<<< SEARCH\nfoo\n")


@pytest.mark.parametrize("text, expected", [
    ("```cpp\nint a;\n```\n```cuda\nint b;\n```\n", "int b;\n"),
    ("```cuda\nint a;\n```\n```python\nx = 1\n```\n", "int a;\n"),
    ("```\nint bare;\n```\n", "int bare;\n"),
    ("```c++\nint a;\n```\n```\nbare\n```\n", "int a;\n"),
    ("  ```CUDA\n  int indented;\n  ```\n", "  int indented;\n"),
    ("no fences at all", None),
    ("```python\nx = 1\n```\n", None),
])
def test_extract_code_block(text, expected):
    assert extract_code_block(text) == expected


def test_diff_rows_side_by_side():
    old = "a\nb\nc\nd\n"
    new = "a\nB\nc\nd\ne\n"
    rows = diff_rows(old, new)
    assert rows[0] == DiffRow("equal", 1, "a", 1, "a")
    assert rows[1] == DiffRow("replace", 2, "b", 2, "B")
    assert DiffRow("insert", None, None, 5, "e") in rows
    assert [r.kind for r in rows].count("equal") == 4  # a, c, d and the final empty line


def test_diff_rows_pads_uneven_replacements_and_deletes():
    rows = diff_rows("x\none\ntwo\ny", "x\nONE\ny")
    replaced = [r for r in rows if r.kind == "replace"]
    assert replaced == [DiffRow("replace", 2, "one", 2, "ONE"), DiffRow("replace", 3, "two", None, None)]
    rows = diff_rows("x\ngone\ny", "x\ny")
    assert [r for r in rows if r.kind == "delete"] == [DiffRow("delete", 2, "gone", None, None)]


def test_diff_rows_folds_long_equal_runs():
    new = PARENT.replace("  __threadfence_system();", "  __threadfence();")
    full = diff_rows(PARENT, new)
    folded = diff_rows(PARENT, new, context=2)
    assert len(full) == len(PARENT.split("\n"))
    skips = [r for r in folded if r.kind == "skip"]
    assert len(skips) == 2 and len(folded) == 2 + 2 + 1 + 2
    changed = [r for r in folded if r.kind == "replace"]
    assert changed == [r for r in full if r.kind == "replace"]
    assert sum(r.skipped for r in skips) + len([r for r in folded if r.kind == "equal"]) == len(full) - 1


def test_unified_diff():
    new = PARENT.replace("  __threadfence_system();", "  __threadfence();")
    text = unified_diff(PARENT, new)
    assert text.startswith("--- parent\n+++ candidate\n@@ ")
    assert "\n-  __threadfence_system();\n+  __threadfence();\n" in text
    assert unified_diff(PARENT, PARENT) == ""
    assert unified_diff("a", "b").endswith("+b\n")
