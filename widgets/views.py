"""Static views: AnalysisView (communication graph + tables), TimelineView (per-rank kernel Gantt), LedgerView,
FailureView (what failed and why, or a plain "no failures in this run")."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from cuco_kit.search.model_stats import model_roles
from cuco_kit.search.population import Population
from cuco_kit.store import Store
from cuco_kit.workbench.report import failure_table

from ._common import badge_html, esc
from .figure_box import FigureBox

if TYPE_CHECKING:  # pragma: no cover - typing only (the analysis imports tree-sitter)
    from cuco_kit.source.analysis import AnalysisReport

_KIND_COLOUR = {"collective": "#d62728", "p2p": "#ff7f0e", "kernel": "#1f77b4", "blas": "#2ca02c",
                "copy": "#9467bd"}


def _table(rows: Iterable[Mapping[str, Any]], columns: list[str] | None = None) -> str:
    df = pd.DataFrame(list(rows))
    if columns is not None and not df.empty:
        df = df[[c for c in columns if c in df.columns]]
    if df.empty:
        return "<i>none</i>"
    return df.to_html(index=False, escape=True, na_rep="")


class AnalysisView(W.VBox):
    """The communication graph of a source (nodes in program order on one lane per stream; edges are buffer
    dependencies, red when nothing orders them) and tables of calls, buffers and kernels.
    `report` is cuco_kit.source.analysis.AnalysisReport or its to_json_dict()."""

    def __init__(self, report: AnalysisReport | Mapping[str, Any]) -> None:
        data = dict(report) if isinstance(report, Mapping) else report.to_json_dict()
        self.data = data
        graph = data.get("graph") or {"nodes": [], "edges": []}
        fig = go.Figure()
        fig.update_layout(height=360, margin=dict(l=90, r=40, t=40, b=50), title="Communication graph",
                               legend=dict(orientation="h", y=-0.2))
        lanes = sorted({str(n.get("stream")) for n in graph["nodes"]})
        lane = {s: i for i, s in enumerate(lanes)}
        pos = {n["id"]: (n["id"], lane[str(n.get("stream"))]) for n in graph["nodes"]}
        for e in graph["edges"]:
            (x0, y0), (x1, y1) = pos[e["src"]], pos[e["dst"]]
            fig.add_scatter(x=[x0, x1], y=[y0, y1], mode="lines", showlegend=False,
                                 line=dict(color="#d62728" if e.get("order") == "unordered" else "#888"),
                                 hovertext=esc(f"{e.get('buffer')} ({e.get('kind')}, {e.get('order')})"),
                                 hoverinfo="text")
        for kind, colour in _KIND_COLOUR.items():
            nodes = [n for n in graph["nodes"] if n.get("kind") == kind]
            if nodes:
                fig.add_scatter(
                    x=[pos[n["id"]][0] for n in nodes], y=[pos[n["id"]][1] for n in nodes], mode="markers+text",
                    name=kind, marker=dict(size=14, color=colour), cliponaxis=False,
                    text=[esc(str(n.get("name"))[:18]) for n in nodes],
                    textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(nodes))],
                    hovertext=[esc(f"{n.get('name')} line {n.get('line')} reads {n.get('reads')} writes "
                                   f"{n.get('writes')}") for n in nodes], hoverinfo="text")
        fig.update_yaxes(tickvals=list(range(len(lanes))), ticktext=[f"stream {esc(s)}" for s in lanes])
        fig.update_xaxes(title="program order", dtick=1, range=[-0.7, max(len(pos), 1) - 0.3])
        fig.update_yaxes(range=[-0.8, max(len(lanes), 1) - 0.2])
        tabs = W.Tab([W.HTML(_table(data.get("collectives", []) + data.get("p2p", []))),
                      W.HTML(_table(data.get("launches", []))), W.HTML(_table(data.get("kernels", []))),
                      W.HTML(_table(data.get("allocations", []))), W.HTML(_table(graph["edges"]))])
        for i, t in enumerate(["communication", "launches", "kernels", "buffers", "dependencies"]):
            tabs.set_title(i, t)
        self.tabs = tabs
        self.fig = FigureBox(fig)
        super().__init__([W.HTML(f"<b>{esc(data.get('filename', ''))}</b>"), self.fig, tabs])


class TimelineView(W.VBox):
    """Per-rank, per-stream kernel Gantt of one evaluated candidate: what overlapped with what.
    `events`: dicts {rank, stream, name, start_us, dur_us} (ranks on one host share a clock). Under the "model"
    badge the times are the model's units, not microseconds, and the title and axis say so."""

    def __init__(self, events: Iterable[Mapping[str, Any]], badge: str = "real", detail: str = "") -> None:
        ev = list(events)
        self.events = ev
        unit = "model time units" if badge == "model" else "us"
        fig = go.Figure()
        fig.update_layout(height=150 + 30 * max(1, len({(e['rank'], e['stream']) for e in ev})),
                               barmode="overlay", margin=dict(l=120, r=20, t=40, b=50),
                               title=("Model schedule" if badge == "model" else "Kernel timeline") + f" ({unit})")
        fig.update_xaxes(title=f"time ({unit})")
        t0 = min((e["start_us"] for e in ev), default=0.0)
        names = sorted({e["name"] for e in ev})
        for name in names:
            sel = [e for e in ev if e["name"] == name]
            fig.add_bar(orientation="h", base=[e["start_us"] - t0 for e in sel],
                             x=[e["dur_us"] for e in sel],
                             y=[esc(f"rank {e['rank']} / s{e['stream']}") for e in sel],  # plotly reads tags in labels
                             name=esc(name)[:40], hovertext=[esc(name)] * len(sel), hoverinfo="text+x")
        if not ev:
            fig.add_annotation(text="no kernel events in this timeline", showarrow=False, xref="paper",
                                    yref="paper", x=0.5, y=0.5)
        self.fig = FigureBox(fig)
        super().__init__([W.HTML(badge_html(badge, detail)), self.fig])


class LedgerView(W.VBox):
    """LLM calls, tokens and dollars of a run (or of the whole store), and per model and role: answers, retries,
    costs and, for mutation, programs and win rate."""

    def __init__(self, store: Store, run_id: int | None = None) -> None:
        self.store, self.run_id = store, run_id
        self.summary = W.HTML()
        self.models = W.HTML()
        self.table = W.HTML()
        super().__init__([self.summary, self.models, self.table])
        self.refresh()

    def model_frame(self) -> pd.DataFrame:
        """One row per (model, role) of the run (model_stats.model_roles)."""
        if self.run_id is None:
            progs, fit = [], {}
        else:
            pop = Population.from_store(self.store, self.run_id)
            progs, fit = pop.all(), {p.id: p.fitness for p in pop.all()}
        rows = model_roles(self.store.llm_calls(self.run_id), progs, fit)
        return pd.DataFrame([r.to_dict() for r in rows])

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.store.llm_calls(self.run_id))

    def refresh(self) -> None:
        df = self.frame()
        if df.empty:
            self.summary.value = "<i>no LLM calls</i>"
            self.models.value = self.table.value = ""
            return
        dollars = self.store.llm_dollars(self.run_id)
        unknown = int(df["dollars"].isna().sum()) if "dollars" in df else 0
        self.summary.value = (
            f"<b>{len(df)}</b> calls, {int(df['prompt_tokens'].sum())} prompt + "
            f"{int(df['completion_tokens'].sum())} completion tokens, <b>${dollars:.4f}</b>"
            + (f" ({unknown} calls at unknown price: tokens only)" if unknown else "")
            + f", {int((~df['ok'].astype(bool)).sum())} failed")
        self.models.value = _table(self.model_frame().to_dict("records"), [
            "model", "role", "calls", "answers", "retries", "dollars", "unpriced_tokens", "programs", "wins",
            "win_rate"])
        cols = [c for c in ["id", "model", "purpose", "prompt_tokens", "completion_tokens", "latency_s",
                            "dollars", "ok", "error"] if c in df.columns]
        self.table.value = df[cols].tail(200).to_html(index=False, escape=True, na_rep="-")


class FailureView(W.HTML):
    """What failed in a run, by level and reason (`cuco_kit.workbench.report.failure_table` of its frame), or one line
    saying there were no failures, instead of an empty header row."""

    def __init__(self, frame: pd.DataFrame, *, run: str = "run") -> None:
        """`run`: what the frame is, for the empty line ("recorded run" for a replayed recording)."""
        table = failure_table(frame)
        self.table = table
        if table.empty:
            n = len(frame)
            value = (f"<div class='cuco-empty' style='color:#555'><i>no failures in this {run} ({n} evaluation"
                     f"{'s' if n != 1 else ''}, all passed or unavailable)</i></div>")
        else:
            value = table.to_html(index=False, escape=True, na_rep="-", border=0)
        super().__init__(value)
