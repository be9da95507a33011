"""Tables of a run for notebooks and widgets: one row per evaluated program, best-so-far, cells. A speed-up
carries its bootstrap interval and a claim ("no measurable difference" when the interval contains 1.0).

Reads the store only; pandas is imported here (not in cuco_kit.store, which the GPU image must import bare).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from cuco_kit.evaluate.api import timing_medians
from cuco_kit.evaluate.overlap import overlap_text
from cuco_kit.evaluate.stats import ratio_label
from cuco_kit.search.cost import gpu_seconds
from cuco_kit.source.markers import plain_knob
from cuco_kit.store import Store
from cuco_kit.workbench.badges import detail_of, label, shown_badge

COLUMNS = ["evaluation_id", "program_id", "parent_id", "second_parent_id", "source", "name", "generation",
           "island", "cell", "knobs", "status", "level_reached", "verdict", "reason", "median_ms", "spread_ms",
           "seed_median_ms", "speedup", "speedup_ci", "claim", "flagged", "badge", "world_size", "backend", "gpu",
           "date", "timing", "device_ms", "e2e_ms", "oracle", "overlap", "gpu_s"]


def run_frame(store: Store, run_id: int) -> pd.DataFrame:
    """One row per evaluation of the run, in evaluation order, joined with its program."""
    programs = {p["id"]: p for p in store.programs(run_id)}
    rows: list[dict[str, Any]] = []
    for e in store.evaluations(run_id=run_id):
        p: Mapping[str, Any] = programs.get(e["program_id"], {})
        prov = e.get("provenance") or {}
        ci = (e.get("result") or {}).get("speedup_ci")
        score, device_ms, e2e_ms = timing_medians((e.get("result") or {}).get("timing"))
        rows.append({
            "evaluation_id": e["id"], "program_id": e["program_id"], "parent_id": p.get("parent_id"),
            "second_parent_id": p.get("second_parent_id"), "source": p.get("source"), "name": p.get("name"),
            "generation": p.get("generation"), "island": p.get("island"), "cell": p.get("cell"),
            "knobs": p.get("knobs") or {}, "status": e.get("status"), "level_reached": e.get("level_reached"),
            "verdict": e.get("verdict"), "reason": e.get("reason"), "median_ms": e.get("median_ms"),
            "spread_ms": e.get("spread_ms"), "seed_median_ms": e.get("seed_median_ms"),
            "speedup": e.get("speedup"), "speedup_ci": ci, "claim": claim(e.get("speedup"), ci),
            "flagged": bool(e.get("flagged")),
            # as shown now: a "real" number read back from a recording or a finished run is replayed, with the
            # GPU and date it was measured on (badges.label), never "real" on a machine that did not measure it
            "badge": label(shown_badge(str(e.get("badge")), live=not store.readonly), detail_of(prov))
            if e.get("badge") else None,
            "world_size": e.get("world_size"), "backend": e.get("backend"), "gpu": prov.get("gpu"),
            "date": prov.get("date"), "timing": score, "device_ms": device_ms, "e2e_ms": e2e_ms,
            "oracle": (e.get("result") or {}).get("oracle"),
            "overlap": overlap_text(e),  # cuco_kit.evaluate.overlap: the fraction of the ideal, or why there is none
            # cuco_kit.search.cost: its GPU seconds (time x ranks) once finished
            "gpu_s": gpu_seconds(e) if e.get("status") == "done" and e.get("finished_at") is not None else None,
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def claim(speedup: float | None, ci: list[float] | None) -> str:
    """What a ratio may claim: "" without a ratio, else `evaluate.stats.ratio_label` ("no measurable
    difference" when its interval contains 1.0, "no interval" when it carries none)."""
    return "" if speedup is None else ratio_label(ci)


def ratio_text(speedup: float | None, ci: list[float] | None) -> str:
    """A speed-up as widgets show it: "1.04x [1.01, 1.07]", with ", no measurable difference" (or ", no
    interval") when that is its claim; "-" without a ratio."""
    if speedup is None:
        return "-"
    text = f"{speedup:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    label = claim(speedup, ci)
    return f"{text}, {label}" if label else text


def with_best_so_far(df: pd.DataFrame) -> pd.DataFrame:
    """Adds `best_ms`: the lowest passing median up to each evaluation (NaN before the first pass)."""
    out = df.copy()
    passing = out["median_ms"].where(out["verdict"] == "pass")
    out["best_ms"] = passing.cummin()
    return out


def cell_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per design-space cell: candidates tried, passes, best median and its program."""
    if df.empty:
        return pd.DataFrame(columns=["cell", "tried", "passed", "best_ms", "best_program"])
    rows = []
    for cell, g in df.groupby(df["cell"].fillna("(none)")):
        ok = g[g["verdict"] == "pass"]
        best = ok.loc[ok["median_ms"].idxmin()] if not ok.empty and ok["median_ms"].notna().any() else None
        rows.append({"cell": cell, "tried": len(g), "passed": len(ok),
                     "best_ms": None if best is None else best["median_ms"],
                     "best_program": None if best is None else int(best["program_id"])})
    return pd.DataFrame(rows).sort_values("best_ms", na_position="last").reset_index(drop=True)


def cell_summary(df: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """The best `top` cells for reading: cells in plain words (`short_cells`), milliseconds rounded."""
    cells = cell_table(df).head(top)
    return cells.assign(cell=short_cells(cells["cell"].tolist()), best_ms=cells["best_ms"].round(4))


def short_cells(cells: list[str]) -> list[str]:
    """Cell keys ('backend=symm|kChunks=2|kPlacement=Placement::kSequential|...') as short labels that a plot axis
    can show: features every knob cell shares are dropped, knob values are said plainly, placement first
    ('Sequential/Barrier/Warp/chunks 2'); a cell without knobs (a seed) reads 'seed-like (no knobs)'."""
    parsed = [dict(p.split("=", 1) for p in str(c).split("|") if "=" in p) for c in cells]
    knobbed = [d for d in parsed if d.get("knobs") != "-"] or parsed
    keys = sorted({k for d in knobbed for k in d if k != "knobs"},
                  key=lambda k: ("placement" not in k.lower(), "chunk" in k.lower(), k))
    varying = [k for k in keys if len({d.get(k) for d in knobbed}) > 1] or keys
    out = []
    for d in parsed:
        if d.get("knobs") == "-":
            out.append("seed-like (no knobs)")
            continue
        out.append("/".join(plain_knob(d[k]) if "::" in d[k] else f"{plain_knob(k)} {d[k]}"
                            for k in varying if k in d) or "(none)")
    return out


def failure_table(df: pd.DataFrame) -> pd.DataFrame:
    """What failed and why, grouped by level and reason."""
    bad = df[df["verdict"].isin(["fail", "error"])]
    if bad.empty:
        return pd.DataFrame(columns=["level_reached", "reason", "count"])
    return (bad.groupby(["level_reached", "reason"]).size().rename("count").reset_index()
            .sort_values("count", ascending=False).reset_index(drop=True))


def run_badge(store: Store, run_id: int) -> tuple[str, str]:
    """(badge, detail) for a run, as cuco_kit.workbench.badges defines them: the run's badge ("real" read back from a
    read-only store, a recording or a finished run, is "replayed") and, when evaluations carry provenance,
    'GPU, date'."""
    run = store.run(run_id)
    detail = ""
    for e in store.evaluations(run_id=run_id):
        detail = detail_of(e.get("provenance"))
        if detail:
            break
    return shown_badge(str(run.get("badge", "real")), live=not store.readonly), detail
