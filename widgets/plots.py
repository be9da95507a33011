"""Live plotly views of a run: LineageTree, LatencyPlot, DesignSpaceMap.

Each view reads the store through cuco_kit.workbench.report and redraws in `refresh()`; RunDashboard calls refresh
from its throttled updater (about once a second), never per event. A redraw builds a whole new figure and shows it in a
FigureBox (widgets/figure_box.py: the whole figure in one message, only when it changed; why not plotly's
FigureWidget is said there). A lineage node's details open from the "program" menu above the tree.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from cuco_kit.evaluate.api import checked_against
from cuco_kit.store import Store
from cuco_kit.workbench.report import cell_table, ratio_text, run_badge, run_frame, short_cells, with_best_so_far

from ._common import badge_html, esc, fmt_ms
from .figure_box import FigureBox
from .program_detail import program_detail_html

NO_PROGRAM = "choose a program to see its diff and numbers"
_FAIL_SYMBOL = {"L0": "x", "L1": "x-thin", "L2": "triangle-down", "L3": "square-x"}


def _hover(row: pd.Series) -> str:
    parts = [f"program {row['program_id']}: {esc(row['name'] or '')}", f"source: {esc(row['source'])}",
             f"verdict: {esc(row['verdict'])} at {esc(row['level_reached'])}"]
    if pd.notna(row["median_ms"]):
        kind = row.get("timing")
        parts.append(f"median: {fmt_ms(row['median_ms'])}" + (f" ({esc(kind)} time)" if isinstance(kind, str) else ""))
    if pd.notna(row.get("device_ms")) and pd.notna(row.get("e2e_ms")):
        parts.append(f"device {fmt_ms(row['device_ms'])}, end to end {fmt_ms(row['e2e_ms'])}")
    if pd.notna(row["speedup"]):
        parts.append(f"speed-up vs seed: {ratio_text(row['speedup'], row['speedup_ci'])}")
    if isinstance(row.get("oracle"), str):
        parts.append(esc(checked_against(row["oracle"])))
    if isinstance(row.get("overlap"), str):
        parts.append(esc(row["overlap"]))
    if pd.notna(row.get("gpu_s")):
        tag = "" if row.get("badge") == "real" else f" [{esc(row['badge'])}]"
        parts.append(f"cost: {row['gpu_s']:.1f} GPU-s{tag}")
    if row["verdict"] != "pass" and row["reason"]:
        parts.append(f"reason: {esc(str(row['reason'])[:80])}")
    return "<br>".join(parts)


class _RunView(W.VBox):
    title = ""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store, self.run_id = store, run_id
        self.badge = W.HTML()
        self.fig = FigureBox()
        super().__init__([self.badge, self.fig])
        self.refresh()

    def frame(self) -> pd.DataFrame:
        return run_frame(self.store, self.run_id)

    def refresh(self) -> None:
        badge, detail = run_badge(self.store, self.run_id)
        self.badge.value = badge_html(badge, detail)
        fig = go.Figure(layout=dict(height=380, margin=dict(l=60, r=20, t=40, b=70), title=self.title,
                                    legend=dict(orientation="h", x=0, y=-0.18, yanchor="top")))
        self._draw(fig, self.frame())
        self.fig.show(fig)

    def _draw(self, fig: go.Figure, df: pd.DataFrame) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class LineageTree(_RunView):
    """Programs by generation; edges parent -> child; colour = speed-up vs the seed; failures marked by level.
    Choosing a program in the menu above the tree (its hover names each node's id) calls every `on_select`
    callback with the program id."""

    title = "Lineage (colour: speed-up vs seed)"

    def __init__(self, store: Store, run_id: int, *, detail: bool = True) -> None:
        self._select_callbacks: list[Callable[[int], None]] = []
        self.positions: dict[int, tuple[float, float]] = {}
        self._quiet = False
        self.picker = W.Dropdown(options=[(NO_PROGRAM, None)], value=None, description="program",
                                 layout=W.Layout(width="420px"))
        self.picker.observe(self._picked, names="value")
        # The chosen program's diff and numbers, under the menu that promises them; `detail=False` when the
        # caller (the dashboard) shows them itself.
        self.detail = W.HTML()
        if detail:
            self.on_select(self.show_program)
        super().__init__(store, run_id)
        self.children = (self.badge, self.picker, self.detail, self.fig) if detail else \
            (self.badge, self.picker, self.fig)

    def show_program(self, program_id: int) -> None:
        self.detail.value = program_detail_html(self.store, program_id)

    def on_select(self, fn: Callable[[int], None]) -> None:
        self._select_callbacks.append(fn)

    def select(self, program_id: int) -> None:
        for fn in self._select_callbacks:
            fn(program_id)

    def _layout(self, df: pd.DataFrame) -> None:
        # Latest evaluation per program; y spreads programs of a generation.
        self.positions.clear()
        per_gen: dict[int, int] = {}
        for _, row in df.drop_duplicates("program_id", keep="last").iterrows():
            g = int(row["generation"] or 0)
            per_gen[g] = per_gen.get(g, 0) + 1
            self.positions[int(row["program_id"])] = (g, per_gen[g])

    def _draw(self, fig: go.Figure, df: pd.DataFrame) -> None:
        if df.empty:
            return
        last = df.drop_duplicates("program_id", keep="last")
        self._layout(df)
        self._programs(last)
        ex, ey = [], []
        for _, row in last.iterrows():
            for parent in (row["parent_id"], row["second_parent_id"]):
                if pd.notna(parent) and int(parent) in self.positions:
                    (x0, y0), (x1, y1) = self.positions[int(parent)], self.positions[int(row["program_id"])]
                    ex += [x0, x1, None]
                    ey += [y0, y1, None]
        fig.add_scatter(x=ex, y=ey, mode="lines", line=dict(color="#bbb", width=1), hoverinfo="skip",
                        showlegend=False, name="edges")
        # A search started from a fast-path result draws the fast path's stages first (search/start_point.py).
        stages = last[last["source"] == "fastpath"]
        last = last[last["source"] != "fastpath"]
        if not stages.empty:
            fig.add_scatter(
                x=[self.positions[int(p)][0] for p in stages["program_id"]],
                y=[self.positions[int(p)][1] for p in stages["program_id"]], mode="markers",
                marker=dict(size=11, color="#6a8caf", symbol="square"), customdata=stages["program_id"].tolist(),
                hovertext=[_hover(r) for _, r in stages.iterrows()], hoverinfo="text", name="fast-path stage")
        ok = last[last["verdict"] == "pass"]
        bad = last[last["verdict"] != "pass"]
        if not ok.empty:
            sp = ok["speedup"].fillna(1.0)
            fig.add_scatter(
                x=[self.positions[int(p)][0] for p in ok["program_id"]],
                y=[self.positions[int(p)][1] for p in ok["program_id"]], mode="markers",
                marker=dict(size=12, color=sp, colorscale="RdYlGn", cmid=1.0, showscale=True,
                            colorbar=dict(title=dict(text="x seed", side="top"), x=1.02, len=0.8,
                                          thickness=14, tickformat=".2f")),
                customdata=ok["program_id"].tolist(), hovertext=[_hover(r) for _, r in ok.iterrows()],
                hoverinfo="text", name="passed")
        if not bad.empty:
            fig.add_scatter(
                x=[self.positions[int(p)][0] for p in bad["program_id"]],
                y=[self.positions[int(p)][1] for p in bad["program_id"]], mode="markers",
                marker=dict(size=11, color="#999",
                            symbol=[_FAIL_SYMBOL.get(str(lv), "x") for lv in bad["level_reached"]]),
                customdata=bad["program_id"].tolist(), hovertext=[_hover(r) for _, r in bad.iterrows()],
                hoverinfo="text", name="failed (symbol = level)")
        fig.update_xaxes(title="generation", dtick=1, tick0=0)  # generations are whole numbers
        fig.update_yaxes(showticklabels=False, title="programs of a generation")

    def _programs(self, last: pd.DataFrame) -> None:
        """The menu lists every program drawn, keeping the one chosen; setting it selects nothing."""
        options = [(NO_PROGRAM, None)] + [
            (f"program {int(r['program_id'])}: {str(r['name'] or '')[:48]} ({r['verdict'] or r['status']})",
             int(r["program_id"])) for _, r in last.sort_values("program_id").iterrows()]
        if options != list(self.picker.options):
            chosen = self.picker.value
            self._quiet = True
            try:
                self.picker.options = options
                self.picker.value = chosen if chosen in {v for _, v in options} else None
            finally:
                self._quiet = False

    def _picked(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and not self._quiet:
            self.select(int(change["new"]))


class LatencyPlot(_RunView):
    """Every evaluated candidate and the best so far against evaluation count, with the seed and any other
    baselines (name -> ms) as horizontal lines."""

    title = "Latency (slowest rank, median ms)"

    def __init__(self, store: Store, run_id: int, baselines: dict[str, float] | None = None) -> None:
        self.baselines = dict(baselines or {})
        super().__init__(store, run_id)

    def _draw(self, fig: go.Figure, df: pd.DataFrame) -> None:
        if df.empty:
            return
        df = with_best_so_far(df).reset_index(drop=True)
        n = list(range(1, len(df) + 1))
        ok = df["verdict"] == "pass"
        fig.add_scatter(x=[n[i] for i in df.index[ok]], y=df.loc[ok, "median_ms"], mode="markers",
                        name="candidates", marker=dict(size=7, color="#1f77b4"),
                        hovertext=[_hover(r) for _, r in df[ok].iterrows()], hoverinfo="text")
        fig.add_scatter(x=n, y=df["best_ms"], mode="lines", line=dict(shape="hv", color="#2ca02c"),
                        name="best so far")
        lines = dict(self.baselines)
        seeds = df["seed_median_ms"].dropna()
        if not seeds.empty:
            lines.setdefault("seed (same run)", float(seeds.median()))
        for name, ms in lines.items():
            if ms and math.isfinite(ms):
                fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=ms, y1=ms,
                              line=dict(dash="dash", color="#888"))
                fig.add_annotation(xref="paper", x=1, yref="y", y=ms, text=esc(name), showarrow=False,
                                   xanchor="right", yanchor="bottom")
        fig.update_xaxes(title="evaluations", rangemode="tozero")
        fig.update_yaxes(title="median latency, slowest rank (ms)", tickformat=".3f")


class DesignSpaceMap(W.VBox):
    """The best latency per design-space cell, as horizontal bars labelled in plain words (the full cell key on
    hover; the best `top` cells), and the whole table, rounded, in a collapsed section."""

    def __init__(self, store: Store, run_id: int, top: int = 15) -> None:
        self.store, self.run_id, self.top = store, run_id, top
        self.badge = W.HTML()
        self.fig = FigureBox()
        self.table = W.HTML()
        section = W.Accordion([self.table])
        section.set_title(0, "all cells (table)")
        section.selected_index = None
        super().__init__([self.badge, self.fig, section])
        self.refresh()

    def refresh(self) -> None:
        badge, detail = run_badge(self.store, self.run_id)
        self.badge.value = badge_html(badge, detail)
        cells = cell_table(run_frame(self.store, self.run_id))
        self.cells = cells
        shown = cells[cells["best_ms"].notna()].head(self.top).iloc[::-1]  # best at the top
        labels = short_cells(cells["cell"].tolist())
        label_of = dict(zip(cells["cell"], labels))
        fig = go.Figure(layout=dict(height=380, margin=dict(l=10, r=20, t=40, b=50),
                                    title=f"Best latency per design-space cell (best {self.top})"))
        if shown.empty:
            fig.add_annotation(text="no cell has a passing measurement yet", showarrow=False,
                               xref="paper", yref="paper", x=0.5, y=0.5)
        else:
            fig.add_bar(
                orientation="h", y=[esc(label_of[c]) for c in shown["cell"]], x=shown["best_ms"],
                text=[fmt_ms(v) for v in shown["best_ms"]], textposition="auto",
                hovertext=[f"{esc(c)}<br>tried {t}, passed {p}" for c, t, p in
                           zip(shown["cell"], shown["tried"], shown["passed"])], hoverinfo="text")
        fig.update_xaxes(title="best median latency (ms)", tickformat=".3f")
        fig.update_yaxes(automargin=True)
        self.fig.show(fig)
        table = cells.assign(cell=labels, best_ms=cells["best_ms"].map(fmt_ms))
        self.table.value = table.to_html(index=False, escape=True, na_rep="-", classes="cuco-table",
                                         border=0)
