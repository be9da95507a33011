"""ChunkExplorer: the overlap model next to the measured chunk counts, with a slider for the chunk count.

Left, the MODEL (formula, badged as such): the pipelined step time relative to sequential for the chosen
communication / compute ratio, against the chunk count. Right, the MEASURED rows of the committed benchmark
(badged with their GPU and date): median latency against the chunk count, one line per placement, for one
size and world size, with the host-NCCL seed as a reference line. Moving the slider marks that chunk count on
both, and one line under them compares the two.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from cuco_kit.workbench.teaching import overlap_bound

from ._common import badge_html, esc, fmt_ms
from .figure_box import FigureBox

# two side by side fit a notebook about 1,100 px wide (a 1280 px window without the side panel); narrower, they wrap
FIG = dict(height=340, width=530, margin=dict(l=60, r=20, t=40, b=50))
MAX_CHUNKS = 16


def chunk_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The measured rows of the device-initiated variants ('Placement/Sync/Issuer/Chunks' names), with
    `placement` and `chunks` split out; passing timed rows only."""
    if frame.empty or "name" not in frame:
        return pd.DataFrame(columns=["preset", "world", "backend", "placement", "chunks", "median_ms"])
    df = frame[frame["name"].astype(str).str.count("/") >= 3].copy()
    if "verdict" in df:
        df = df[df["verdict"] == "pass"]
    df = df[df["median_ms"].notna()]
    parts = df["name"].astype(str).str.split("/")
    df["placement"] = parts.str[0]
    df["chunks"] = pd.to_numeric(parts.str[-1], errors="coerce")
    return df[df["chunks"].notna()].astype({"chunks": int})


class ChunkExplorer(W.VBox):
    def __init__(self, measured: pd.DataFrame, *, badge: str = "replayed", detail: str = "") -> None:
        self.all = measured
        self.rows = chunk_rows(measured)
        configs = sorted({(str(p), int(w), str(b)) for p, w, b in
                          self.rows[["preset", "world", "backend"]].itertuples(index=False)}) \
            if not self.rows.empty else []
        self.config = W.Dropdown(options=[(f"{p}, {w} rank(s), {b}", (p, w, b)) for p, w, b in configs],
                                 description="measured", layout=W.Layout(width="320px"))
        self.chunks = W.IntSlider(value=4, min=1, max=MAX_CHUNKS, description="chunks", continuous_update=False)
        self.ratio = W.FloatLogSlider(value=1.0, base=2, min=-2, max=2, step=0.25, description="comm/compute",
                                      continuous_update=False, readout_format=".2f")
        self.model_fig = FigureBox()
        self.measured_fig = FigureBox()
        self.summary = W.HTML()
        for w in (self.config, self.chunks, self.ratio):
            w.observe(lambda _: self.redraw(), names="value")
        empty = "" if configs else ("<i>no measured chunk variants are recorded (recordings/MANIFEST.json lists "
                                    "no benchmark of this workload); only the model is drawn</i>")
        super().__init__([
            W.HBox([self.chunks, self.ratio, self.config]),
            # side by side where the notebook is wide enough, else the measured plot wraps below the model
            W.HBox([W.VBox([W.HTML(badge_html("model", "formula")), self.model_fig]),
                    W.VBox([W.HTML(badge_html(badge, detail)), self.measured_fig])],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HTML(empty), self.summary])
        self.redraw()

    def redraw(self) -> None:
        k, ratio = int(self.chunks.value), float(self.ratio.value)
        xs = list(range(1, MAX_CHUNKS + 1))
        rel = [overlap_bound(1.0, ratio, n)["pipelined_ms"] / (1.0 + ratio) for n in xs]
        model = go.Figure(layout=dict(**FIG, title="Model: step time vs sequential"))
        model.add_scatter(x=xs, y=rel, mode="lines+markers", name="pipelined",
                          hovertemplate="%{x} chunks: %{y:.2f} of sequential<extra></extra>")
        model.add_scatter(x=[k], y=[rel[k - 1]], mode="markers", name=f"{k} chunks",
                          marker=dict(size=14, color="#d62728"))
        model.update_xaxes(title="chunks", dtick=1)
        model.update_yaxes(title="time / sequential", range=[0.4, 1.05], tickformat=".0%")
        model.update_layout(legend=dict(orientation="h", y=-0.25))
        text = f"model at {k} chunks, comm/compute {ratio:.2f}: {rel[k - 1]:.0%} of the sequential time"
        measured = go.Figure(layout=dict(**FIG, title="Measured: median latency"))
        if self.config.value is not None:
            p, w, b = self.config.value
            sel = self.rows[(self.rows["preset"].astype(str) == p) & (self.rows["world"] == w)
                            & (self.rows["backend"] == b)]
            for placement, g in sel.groupby("placement"):
                best = g.groupby("chunks")["median_ms"].min().sort_index()
                measured.add_scatter(
                    x=best.index.tolist(), y=best.tolist(), mode="lines+markers", name=esc(placement),
                    hovertemplate="%{x} chunks: %{y:.3f} ms<extra>" + esc(placement) + "</extra>")
            seed = self.all[(self.all["preset"].astype(str) == p) & (self.all["world"] == w)
                            & (self.all["backend"] == b) & (self.all["name"] == "seed_nccl.cu")]
            if not seed.empty:
                ms = float(seed["median_ms"].min())
                measured.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=ms, y1=ms,
                                   line=dict(dash="dash", color="#888"))
                measured.add_annotation(xref="paper", x=1, yref="y", y=ms, showarrow=False,
                                        text=f"host-NCCL seed {ms:.3f} ms", xanchor="right", yanchor="bottom")
            at_k = sel[sel["chunks"] == k]
            if not at_k.empty:
                measured.add_scatter(x=at_k["chunks"], y=at_k["median_ms"], mode="markers", name=f"{k} chunks",
                                     marker=dict(size=13, color="#d62728", symbol="circle-open"))
                text += (f"; measured at {k} chunks ({esc(p)}, {w} rank(s)): best "
                         f"{fmt_ms(at_k['median_ms'].min())}, worst {fmt_ms(at_k['median_ms'].max())}")
            elif not sel.empty:
                text += f"; no measured variant has {k} chunks (measured: " + \
                    ", ".join(str(c) for c in sorted(sel["chunks"].unique())) + ")"
        measured.update_xaxes(title="chunks", type="log", tickvals=[1, 2, 4, 8, 16])
        measured.update_yaxes(title="median latency (ms)", tickformat=".3f")
        measured.update_layout(legend=dict(orientation="h", y=-0.25))
        self.model_fig.show(model)
        self.measured_fig.show(measured)
        self.summary.value = esc(text)

    def state(self) -> dict[str, Any]:
        """What the views show (for tests): the chosen chunk count and the traces' names."""
        return {"chunks": int(self.chunks.value), "model": [t.name for t in self.model_fig.data],
                "measured": [t.name for t in self.measured_fig.data]}
