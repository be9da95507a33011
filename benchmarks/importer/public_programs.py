"""`cuco init` on real public host-driven CUDA + NCCL programs: what imports with no edit, what needs a plan
correction (and which), what does not import and why.

  python3 benchmarks/importer/public_programs.py FOLDER --out DIR [--kit ROOT] [--corrections FILE] [--sources FILE]
      [--only a,b]

FOLDER holds the programs as <name>.cu (plus the headers they include), fetched by hand from the sources listed
in public_programs.json (repository, path, commit; no code): they are never part of this repository. ROOT is the
kit under test (default: this repository); every cuco command runs from it, so another worktree's importer can
be measured with this script. Per program:

1. `cuco init PROGRAM --workload DIR/workloads/NAME --plan-only`: the plan, or the one line that refused it;
2. the corrections file's entry for NAME, if any ({"field": value} replacing top-level plan fields), is applied
   to the written plan, and the row says which fields were corrected;
3. `cuco init PROGRAM --workload ...` (the full import, from the plan in the folder);
4. `cuco check-workload ... --no-compile --json`: what is left (the reference is expected to be);
5. the seed built with nvcc through the kit's own build (cuco_kit.evaluate.build) for `nccl`, and for `symm`
   when the kit has the compat host NCCL header (cuco_kit/runtime/symm_nccl/nccl.h).

Writes DIR/public_programs.json (every command's exit code and last line) and DIR/public_programs.md (the table).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "public_programs.json"
DEFAULT_CORRECTIONS = HERE / "plan_corrections.json"
PLAN_FILE = "cuco_plan.json"
SYMM_COMPAT_HEADER = Path("cuco_kit/runtime/symm_nccl/nccl.h")
COMMAND_TIMEOUT_S = 600.0
REFUSED = 2  # cuco's exit code for bad input, said in one line
TODO = "TODO(cuco init)"  # how cuco init marks what a person must still write
EXPECTED_LEFT = ("reference", "tolerance")  # what an import leaves to a person by design
# Run inside the kit under test, so its build configuration (include paths, the compat header) is the one used.
BUILD_SNIPPET = """
import json, sys
from cuco_kit.evaluate.build import build_file, for_workload
r = build_file(sys.argv[1], sys.argv[2], for_workload(None, sys.argv[3]))
errors = [ln for ln in (r.log or "").splitlines() if "error" in ln]
print(json.dumps({"ok": r.ok, "line": "" if r.ok else (errors[0] if errors else "see the log")}))
"""

NO_EDIT = "imported with no edit"
CORRECTED = "imported after a plan correction"
NO_BUILD = "imported, seed does not build"
MORE_LEFT = "imported, more than the reference left"
NOT_IMPORTED = "not imported"
CONTROL = "refused as expected"
MISSING = "missing"


@dataclass
class Step:
    """One command: its exit code (None: timed out or could not start), its last meaningful output line and, when
    it failed, the problems it listed before that line (cuco init prints each of a plan's problems on one)."""
    rc: int | None
    line: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class Row:
    name: str
    source: str  # repository:path@commit (short)
    control: str = ""  # why the program is expected not to import (e.g. it makes no NCCL collective call)
    present: bool = True
    plan_only: Step | None = None
    plan_written: bool = False
    plan_todos: list[str] = field(default_factory=list)  # plan fields still marked TODO after the analysis
    corrected: list[str] = field(default_factory=list)  # plan fields replaced from the corrections file
    imported: Step | None = None
    left: list[str] = field(default_factory=list)  # check-workload's problems: "what: message"
    builds: dict[str, str] = field(default_factory=dict)  # backend -> "ok" | "failed: LINE" | "skipped: WHY"


# ---- the table's logic (tests/unit/importer/test_public_programs_table.py) ------------------------------------------


def todo_fields(plan: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the plan's values that still say TODO (what the analysis left for a person to decide)."""
    if isinstance(plan, dict):
        return [p for k, v in plan.items() for p in todo_fields(v, f"{prefix}{k}.")]
    if isinstance(plan, list):
        return [p for i, v in enumerate(plan) for p in todo_fields(v, f"{prefix}{i}.")]
    return [prefix.rstrip(".")] if isinstance(plan, str) and "TODO" in plan else []


def apply_corrections(plan: dict[str, Any], corrections: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The plan with each corrected top-level field replaced, and the names of the fields that changed."""
    changed = sorted(k for k, v in corrections.items() if plan.get(k) != v)
    return {**plan, **corrections}, changed


def outcome(row: Row) -> tuple[str, str]:
    """(outcome, why) of one program, from its commands' results."""
    if not row.present:
        return MISSING, "not in the folder"
    imported = row.imported is not None and row.imported.ok
    if not imported:
        last = row.imported if row.imported is not None else row.plan_only
        why = ("; ".join(last.problems) or last.line) if last is not None else "not run"
        if row.plan_todos and not row.corrected:
            why = f"plan needs a correction of {', '.join(row.plan_todos)}: {why}"
        refused = last is not None and last.rc == REFUSED  # a one-line refusal, not a crash or a time-out
        if last is not None and not refused:
            why = f"{step_cell(last)}: {why}"
        return (CONTROL if row.control and refused else NOT_IMPORTED), why
    if row.builds.get("nccl", "").startswith("failed"):
        return NO_BUILD, row.builds["nccl"]
    corrected = "corrected: " + ", ".join(row.corrected) if row.corrected else ""
    more = [k for k in left_kinds(row) if k not in EXPECTED_LEFT]
    if more:
        return MORE_LEFT, "; ".join(([corrected] if corrected else []) + more)
    return (CORRECTED, corrected) if corrected else (NO_EDIT, "")


def step_cell(step: Step | None) -> str:
    if step is None:
        return "-"
    return "ok" if step.ok else ("timed out" if step.rc is None else f"exit {step.rc}")


def left_kind(finding: str) -> str:
    """What a check-workload problem is about: the reference and the tolerance (expected to be left after an
    import) by name, anything else as it was said."""
    what, _, message = finding.partition(": ")
    for kind in EXPECTED_LEFT:
        if what.startswith(kind) or (TODO in message and kind in message.lower()):
            return kind
    return finding


def left_kinds(row: Row) -> list[str]:
    return list(dict.fromkeys(left_kind(f) for f in row.left))


def left_cell(row: Row) -> str:
    if row.imported is None or not row.imported.ok:
        return "-"
    return "; ".join(left_kinds(row)) or "nothing"


def cell(text: str) -> str:
    """Text fit for one markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(rows: list[Row]) -> str:
    head = ("| program | source | outcome | why / what was corrected | plan-only | check-workload: left | "
            "nccl build | symm build |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        what, why = outcome(r)
        lines.append("| " + " | ".join(cell(c) for c in (
            r.name, r.source, what, why, step_cell(r.plan_only), left_cell(r),
            r.builds.get("nccl", "-"), r.builds.get("symm", "-"))) + " |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        what = outcome(r)[0]
        counts[what] = counts.get(what, 0) + 1
    order = (NO_EDIT, CORRECTED, MORE_LEFT, NO_BUILD, NOT_IMPORTED, CONTROL, MISSING)
    return ", ".join(f"{counts[k]} {k}" for k in order if k in counts)


# ---- running the kit's commands -------------------------------------------------------------------------------


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run(cmd: list[str], kit: Path) -> tuple[int | None, str, str]:
    """Run a command from the kit's root with that kit first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(kit)}
    try:
        p = subprocess.run(cmd, cwd=kit, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {COMMAND_TIMEOUT_S:g} s"
    except OSError as e:
        return None, "", f"cannot start {cmd[0]}: {e.strerror}"
    return p.returncode, p.stdout, p.stderr


def cuco(kit: Path, *args: str) -> tuple[Step, str]:
    rc, out, err = run([sys.executable, "-m", "cuco_kit", *args], kit)
    said = [ln.strip().removeprefix(f"cuco {args[0]}: ") for ln in err.splitlines() if ln.strip()]
    return Step(rc, last_line(err) or last_line(out), said[:-1] if rc not in (0, None) else []), out


def build_seed(kit: Path, seed: Path, backend: str) -> str:
    if backend == "symm" and not (kit / SYMM_COMPAT_HEADER).is_file():
        return f"skipped: the kit has no {SYMM_COMPAT_HEADER}"
    rc, out, err = run([sys.executable, "-c", BUILD_SNIPPET, str(seed), backend, str(seed.parent)], kit)
    if rc != 0:
        return f"failed: {last_line(err) or f'exit {rc}'}"
    verdict = json.loads(last_line(out))
    return "ok" if verdict["ok"] else f"failed: {verdict['line']}"


def measure(source: dict[str, Any], folder: Path, out: Path, kit: Path, corrections: dict[str, Any]) -> Row:
    name = source["name"]
    row = Row(name, f"{source['repo']}:{source['path']}@{source['commit'][:7]}", source.get("control", ""))
    program = folder / f"{name}.cu"
    if not program.is_file():
        row.present = False
        return row
    wl = out / "workloads" / name
    shutil.rmtree(wl, ignore_errors=True)
    row.plan_only, _ = cuco(kit, "init", str(program), "--workload", str(wl), "--plan-only")
    plan_path = wl / PLAN_FILE
    row.plan_written = plan_path.is_file()
    if not row.plan_written:
        return row
    plan = json.loads(plan_path.read_text())
    row.plan_todos = todo_fields(plan)
    if name in corrections:
        plan, row.corrected = apply_corrections(plan, corrections[name])
        plan_path.write_text(json.dumps(plan, indent=2) + "\n")
    row.imported, _ = cuco(kit, "init", str(program), "--workload", str(wl), "--force")
    if not row.imported.ok:
        return row
    check, report = cuco(kit, "check-workload", str(wl), "--no-compile", "--json")
    try:
        findings = json.loads(report)["findings"]
        row.left = [f"{f['what']}: {f['message']}" for f in findings if f["status"] in ("todo", "error")]
    except (json.JSONDecodeError, KeyError):
        row.left = [f"check-workload gave no report: {check.line}"]
    seed = wl / "seed_nccl.cu"
    for backend in ("nccl", "symm"):
        row.builds[backend] = build_seed(kit, seed, backend) if seed.is_file() else "failed: no seed_nccl.cu"
    return row


def kit_commit(kit: Path) -> str:
    rc, out, _ = run(["git", "rev-parse", "--short", "HEAD"], kit)
    return out.strip() if rc == 0 else "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the folder of fetched programs (<name>.cu, as in the sources list)")
    ap.add_argument("--out", type=Path, required=True, help="where the workloads, the JSON and the table go")
    ap.add_argument("--kit", type=Path, default=HERE.parents[1], help="root of the kit under test")
    ap.add_argument("--corrections", type=Path, default=DEFAULT_CORRECTIONS,
                    help="plan corrections per program: {name: {plan field: value}}")
    ap.add_argument("--sources", type=Path, default=SOURCES, help="the sources list (name, repo, path, commit)")
    ap.add_argument("--only", default="", help="comma list of program names")
    args = ap.parse_args()
    if not args.folder.is_dir():
        print(f"public_programs: {args.folder} is not a folder; give the folder of fetched programs", file=sys.stderr)
        return 2
    sources = json.loads(args.sources.read_text())
    only = {n for n in args.only.split(",") if n}
    unknown = only - {s["name"] for s in sources}
    if unknown:
        print(f"public_programs: --only names {', '.join(sorted(unknown))}, not in {args.sources}", file=sys.stderr)
        return 2
    corrections = json.loads(args.corrections.read_text()) if args.corrections.is_file() else {}
    kit, out = args.kit.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in sources:
        if only and s["name"] not in only:
            continue
        rows.append(measure(s, args.folder.resolve(), out, kit, corrections))
        print(f"{rows[-1].name}: {' - '.join(x for x in outcome(rows[-1]) if x)}", flush=True)
    meta = {"date": dt.date.today().isoformat(), "kit": str(kit), "kit_commit": kit_commit(kit),
            "folder": str(args.folder), "corrections": str(args.corrections) if corrections else None}
    (out / "public_programs.json").write_text(json.dumps(
        {"meta": meta, "rows": [{**asdict(r), "outcome": outcome(r)[0], "why": outcome(r)[1]} for r in rows]},
        indent=2) + "\n")
    (out / "public_programs.md").write_text(
        f"# cuco init on public programs\n\nkit {meta['kit_commit']}, {meta['date']}: {summary(rows)}.\n\n"
        f"{markdown_table(rows)}\n")
    print(f"{summary(rows)}; wrote {out / 'public_programs.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
