"""The fast path's deterministic steps: stage L0 checks, the annotation check, the fallback annotator, log
tails. No LLM here; `pipeline.py` drives the loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.source import cuda_parse as cp
from cuco_kit.source import markers, static_check
from cuco_kit.source.analysis import AnalysisReport, analyze

ABI_ENTRY_POINTS = ("cuco_setup", "cuco_step", "cuco_teardown")
_INCLUDE_IN_BLOCK = "#include inside EVOLVE block"
_WHOLE = "whole_file"


@dataclass
class L0Check:
    """Verdict of the fast path's L0 on one attempt. For stage outputs (no markers yet): the file parses, host
    calls anywhere in it are on the L0 allow-list, the ABI entry points exist and the stage's contract holds
    (Stage A keeps host collectives and creates a devComm; Stage B has no host communication and uses the
    backend's device API). For annotations: static_check.check_candidate plus the byte-for-byte marker check."""

    ok: bool
    reasons: list[str] = field(default_factory=list)
    features: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "reasons": list(self.reasons), "features": dict(self.features)}


def whole_file_whitelist(code: str) -> list[str]:
    """L0's host-call allow-list applied to every line of a file without markers (an LLM wrote all of it)."""
    lines = code.split("\n")
    whole = markers.Block(_WHOLE, 0, len(lines) + 1, code, 0, len(code))
    # One block over the whole file: the same checker as for candidates, so one allow-list serves both uses.
    problems = static_check.whitelist_problems(code, [whole])
    where = f"inside EVOLVE block {_WHOLE!r}"
    return [p.replace(where, "in the file") for p in problems if _INCLUDE_IN_BLOCK not in p]


def defined_functions(code: str) -> set[str]:
    return {cp.function_name(n) for n in cp.walk(cp.parse(code).root_node) if n.type == "function_definition"}


def check_stage_output(code: str, stage: str, backend: str, seed_report: AnalysisReport | None = None) -> L0Check:
    """L0 for a Stage A / Stage B output (see L0Check)."""
    problem = static_check.source_problem(code)
    if problem is not None:
        return L0Check(False, [f"the answer's code {problem}"])
    reasons: list[str] = []
    if markers.START_MARKER in code or markers.END_MARKER in code:
        reasons.append("EVOLVE markers belong to the annotate step; remove them from this stage's output")
    reasons += whole_file_whitelist(code)
    missing = [f for f in ABI_ENTRY_POINTS if f not in defined_functions(code)]
    if missing:
        reasons.append(f"the ABI entry point(s) {', '.join(missing)} are not defined (cuco_abi.h v1 needs "
                       f"{', '.join(ABI_ENTRY_POINTS)})")
    try:
        rep = analyze(code, f"stage_{stage}.cu")
    except BadInput as exc:
        return L0Check(False, reasons + [f"analysis: {exc}"])
    feats = rep.features()
    names = set(rep.device_api_names) | {s.call for s in rep.setup}
    if stage == "A":
        if not names & {"cuco_devcomm_create", "cuco_devcomm_create_gin", "ncclDevCommCreate"}:
            reasons.append("Stage A must create the devComm in cuco_setup with cuco_devcomm_create(ctx, "
                           "lsaBarrierCount, &devComm)")
        seed_calls = sorted({c.call for c in (seed_report.collectives + seed_report.p2p)}) if seed_report else []
        kept = {c.call for c in rep.collectives + rep.p2p}
        lost = [c for c in seed_calls if c not in kept]
        if lost:
            reasons.append(f"Stage A must keep the host collectives; {', '.join(lost)} disappeared (they are "
                           "replaced in Stage B)")
    elif stage == "B":
        host = [f"{c.call} (line {c.line})" for c in rep.collectives + rep.p2p]
        if host:
            reasons.append(f"host NCCL communication is still called: {', '.join(host)}; Stage B replaces it "
                           "with device-initiated communication")
        if backend == "lsa" and not feats.get("uses_lsa"):
            reasons.append("no LSA device communication found (ncclGetLsaPointer / ncclLsaBarrierSession / "
                           "ncclTeamLsa); --backend lsa moves data with LSA stores")
        if backend == "gin" and not feats.get("uses_gin"):
            reasons.append("no GIN device communication found (ncclGin put / signal); --backend gin moves data "
                           "with GIN puts")
    return L0Check(not reasons, reasons, feats)


def first_difference(a: str, b: str) -> str:
    """Where two texts first differ, as 'line N: expected ... got ...' (for the annotate rejection)."""
    la, lb = a.split("\n"), b.split("\n")
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else "<end of file>"
        y = lb[i] if i < len(lb) else "<end of file>"
        if x != y:
            return f"line {i + 1}: input has {x[:80]!r}, the annotation without markers has {y[:80]!r}"
    return "no difference"


def check_annotation(annotated: str, original: str) -> L0Check:
    """Accept an annotation only if removing its markers gives back `original` byte for byte, it has at least
    one block, and static_check.check_candidate accepts it (markers well formed, knobs only in the knob block,
    host calls inside blocks on the allow-list)."""
    try:
        stripped = markers.strip_markers(annotated)
        found = markers.blocks(annotated)
    except markers.MarkerError as exc:
        return L0Check(False, [f"markers: {exc}"])
    reasons: list[str] = []
    if stripped != original:
        reasons.append("removing the EVOLVE markers does not give back the input byte for byte (only marker "
                       f"lines may be added): {first_difference(original, stripped)}")
    if not found:
        reasons.append("no EVOLVE block was added")
    if not reasons:
        rep = static_check.check_candidate(annotated)
        reasons += rep.reasons
        return L0Check(rep.ok and not reasons, reasons, {"blocks": rep.blocks, "knobs": rep.knob_values})
    return L0Check(False, reasons)


# ---- deterministic fallback annotator ------------------------------------------------------------------

def _own_lines(code_lines: list[str], start_row: int, start_col: int, end_row: int, end_col: int) -> bool:
    """True when a node spans whole lines: only whitespace before it on its first line and after it on its
    last, so marker lines can go around it."""
    before = code_lines[start_row][:start_col]
    after = code_lines[end_row][end_col:]
    return not before.strip() and (not after.strip() or after.strip().startswith("//"))


def _byte_col_to_char(line: str, col: int) -> int:
    return len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))


def fallback_annotate(code: str) -> tuple[str, list[str]]:
    """Wrap the knob lines in `knobs`, every __global__ kernel in `kernel_<name>` and cuco_step's body in
    `step`, inserting marker lines only. Returns (annotated code, notes on what could not be wrapped)."""
    lines = code.split("\n")
    regions: list[tuple[int, int, str]] = []  # (first row, last row) inclusive, 0-based, name
    notes: list[str] = []
    tree = cp.parse(code)
    for node in cp.walk(tree.root_node):
        if node.type != "function_definition":
            continue
        name = cp.function_name(node)
        text = cp.node_text(node)
        outer = node.parent if node.parent is not None and node.parent.type == "template_declaration" else node
        sr, er = outer.start_point[0], outer.end_point[0]
        sc = _byte_col_to_char(lines[sr], outer.start_point[1])
        ec = _byte_col_to_char(lines[er], outer.end_point[1])
        if "__global__" in text.split("{", 1)[0]:
            if _own_lines(lines, sr, sc, er, ec):
                safe = re.sub(r"\W", "_", name)
                regions.append((sr, er, f"kernel_{safe}"))
            else:
                notes.append(f"kernel {name} (line {sr + 1}) shares a line with other code; not wrapped")
        elif name == "cuco_step":
            body = node.child_by_field_name("body")
            if body is None:
                continue
            br, bend = body.start_point[0], body.end_point[0]
            after_open = lines[br][_byte_col_to_char(lines[br], body.start_point[1]) + 1:]
            before_close = lines[bend][:_byte_col_to_char(lines[bend], body.end_point[1]) - 1]
            if after_open.strip() or before_close.strip() or bend - br < 2:
                notes.append("cuco_step's braces share lines with its body; body not wrapped")
            else:
                regions.append((br + 1, bend - 1, "step"))
    knob_rows = [i for i, line in enumerate(lines) if markers.is_knob_declaration(line)]
    if knob_rows:
        runs: list[list[int]] = [[knob_rows[0]]]
        for r in knob_rows[1:]:
            if r == runs[-1][-1] + 1:
                runs[-1].append(r)
            else:
                runs.append([r])
        if len(runs) == 1:
            regions.append((runs[0][0], runs[0][-1], markers.KNOB_BLOCK))
        else:
            notes.append(f"knob lines are in {len(runs)} separate groups (lines "
                         f"{', '.join(str(r[0] + 1) for r in runs)}); a knob block must hold them all, so none "
                         "was wrapped")
    regions.sort()
    kept: list[tuple[int, int, str]] = []
    for region in regions:  # blocks do not nest: drop a region overlapping an earlier one
        if kept and region[0] <= kept[-1][1]:
            notes.append(f"region {region[2]} overlaps {kept[-1][2]}; not wrapped")
            continue
        kept.append(region)
    starts = {s: n for s, _, n in kept}
    ends = {e for _, e, _ in kept}
    out: list[str] = []
    for i, line in enumerate(lines):
        indent = _leading_blanks(line) if i in starts else ""
        if i in starts:
            out.append(f"{indent}// {markers.START_MARKER} {starts[i]}")
        out.append(line)
        if i in ends:
            out.append(f"{indent if i in starts else _indent_of(lines, i, kept)}// {markers.END_MARKER}")
    return "\n".join(out), notes


def _indent_of(lines: list[str], end_row: int, regions: list[tuple[int, int, str]]) -> str:
    for s, e, _ in regions:
        if e == end_row:
            return _leading_blanks(lines[s])
    return ""


def _leading_blanks(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


# ---- logs ------------------------------------------------------------------------------------------------

def tail(text: str, n: int) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]
