"""Tables of a run for notebooks and widgets: one row per evaluated program, best-so-far, cells. A speed-up
carries its bootstrap interval and a claim ("no measurable difference" when the interval contains 1.0).

Reads the store only; pandas is imported here (not in cuco_kit.store, which the GPU image must import bare).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from cuco_kit.evaluate.api import timing_medians
from cuco_kit.evaluate.stats import ratio_label
from cuco_kit.store import Store

COLUMNS = ["evaluation_id", "program_id", "parent_id", "second_parent_id", "source", "name", "generation",
           "island", "cell", "knobs", "status", "level_reached", "verdict", "reason", "median_ms", "spread_ms",
           "seed_median_ms", "speedup", "speedup_ci", "claim", "flagged", "badge", "world_size", "backend", "gpu",
           "date", "timing", "device_ms", "e2e_ms"]


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
            "flagged": bool(e.get("flagged")), "badge": e.get("badge"),
            "world_size": e.get("world_size"), "backend": e.get("backend"), "gpu": prov.get("gpu"),
            "date": prov.get("date"), "timing": score, "device_ms": device_ms, "e2e_ms": e2e_ms,
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


def failure_table(df: pd.DataFrame) -> pd.DataFrame:
    """What failed and why, grouped by level and reason."""
    bad = df[df["verdict"].isin(["fail", "error"])]
    if bad.empty:
        return pd.DataFrame(columns=["level_reached", "reason", "count"])
    return (bad.groupby(["level_reached", "reason"]).size().rename("count").reset_index()
            .sort_values("count", ascending=False).reset_index(drop=True))


def run_badge(store: Store, run_id: int) -> tuple[str, str]:
    """(badge, detail) for a run: the run's badge and, when evaluations carry provenance, 'GPU, date'."""
    run = store.run(run_id)
    detail = ""
    for e in store.evaluations(run_id=run_id):
        prov = e.get("provenance") or {}
        if prov.get("gpu"):
            detail = ", ".join(str(prov[k]) for k in ("gpu", "date") if prov.get(k))
            break
    return run.get("badge", "real"), detail
