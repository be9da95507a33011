"""EvalCell: launch an evaluation on N ranks from a cell that returns at once, with per-rank progress, the
cascade level reached, a one-line summary (the full log tail folded under it: compiler command lines and the
ranks' warnings read as alarms when shown raw) and a pandas table of every result in this cell, scrolled
sideways inside the output rather than cut at its edge.

When the evaluator replays recordings it knows which configurations were measured (`configs(workload_dir)`):
those are offered first, in a "recorded" menu that sets ranks, backend and sizes, and the first is chosen."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ipywidgets as W
import pandas as pd

from cuco_kit.evaluate.api import EvalRequest, EvalResult, Evaluator, checked_against, timing_medians
from cuco_kit.evaluate.recordings import RecordedConfig
from cuco_kit.workbench.report import claim, ratio_text
from cuco_kit.workload import load_workload

from ._common import Throttle, badge_html, esc, fmt_ms, provenance_detail, short
from .views import TimelineView

REASON_CHARS = 40


class EvalCell(W.VBox):
    def __init__(self, evaluator: Evaluator, workload_dir: str | Path, *, candidates: dict[str, str] | None = None,
                 ranks: Sequence[int] = (1, 2, 4), backends: Sequence[str] = ("nccl", "symm"),
                 iters: int = 20, interval: float = 1.0) -> None:
        self.evaluator = evaluator
        self.workload = load_workload(workload_dir)
        names = set(self.workload.seeds.values())
        if self.workload.baseline is not None:
            names.add(self.workload.baseline)
        files = candidates or {f: (self.workload.directory / f).read_text() for f in sorted(names)}
        self.sources = dict(files)
        presets: dict[str, dict[str, int]] = {"default": {}, **self.workload.size_presets}
        recorded = self._recorded(evaluator, presets)
        rec_ranks = [c.world_size for c, _ in recorded]
        rank_opts = list(dict.fromkeys([*rec_ranks, *ranks]))
        backend_opts = list(dict.fromkeys([*(c.backend for c, _ in recorded), *backends]))
        self.candidate = W.Dropdown(options=list(self.sources), description="candidate")
        self.ranks = W.Dropdown(options=rank_opts, value=rank_opts[0], description="ranks",
                                layout=W.Layout(width="160px"))
        self.backend = W.Dropdown(options=backend_opts, value=backend_opts[0], description="backend",
                                  layout=W.Layout(width="180px"))
        self.preset = W.Dropdown(options=list(presets), description="sizes", layout=W.Layout(width="200px"))
        self._presets = presets
        self.recorded = W.Dropdown(
            options=[(f"{c.label()} ({preset})", i) for i, (c, preset) in enumerate(recorded)]
            + [("other (not recorded)", -1)], value=0 if recorded else -1, description="recorded",
            layout=W.Layout(width="auto", display="" if recorded else "none"))
        self._recorded_configs = recorded
        self.recorded.observe(lambda ch: self._apply_recorded(int(ch["new"])), names="value")
        self._apply_recorded(self.recorded.value)
        self.iters = iters
        self.button = W.Button(description="Evaluate", button_style="primary", icon="play")
        self.button.on_click(lambda _: self.run())
        self.level = W.HTML("<i>idle</i>")
        self.bars = W.VBox()
        self.summary = W.HTML()  # one line: the latest message, or the result's reason
        self.summary.add_class("cuco-eval-summary")
        self.log_view = W.HTML()
        self.log_box = W.Accordion([self.log_view], selected_index=None)
        self.log_box.set_title(0, "full log")
        self.log_box.layout.display = "none"
        self.table = W.HTML()
        self.timeline_box = W.VBox()  # the kernel timeline of the latest passing evaluation, when it has one
        self.results: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"level": "", "ranks": {}, "lines": []}
        self._thread: threading.Thread | None = None
        self._refresh = Throttle(self._render, interval)
        super().__init__([self.recorded,
                          W.HBox([self.candidate, self.ranks, self.backend, self.preset, self.button]),
                          self.level, self.bars, self.summary, self.log_box, self.table, self.timeline_box])

    def _recorded(self, evaluator: Evaluator, presets: dict[str, dict[str, int]]
                  ) -> list[tuple[RecordedConfig, str]]:
        """(configuration, preset name) of every recorded configuration of this workload; sizes that are no
        preset become one, named by their values."""
        configs = getattr(evaluator, "configs", None)
        if not callable(configs):
            return []
        out = []
        for c in configs(str(self.workload.directory)):
            name = next((n for n, p in presets.items() if self.workload.resolve(p) == c.sizes), None)
            if name is None:
                name = " ".join(f"{k}={v}" for k, v in c.params)
                presets[name] = c.sizes
            out.append((c, name))
        return out

    def _apply_recorded(self, index: int) -> None:
        if index < 0 or index >= len(self._recorded_configs):
            return
        c, preset = self._recorded_configs[index]
        self.ranks.value, self.backend.value, self.preset.value = c.world_size, c.backend, preset

    # -- engine side (worker thread) -------------------------------------------------------------------------
    def _progress(self, ev: dict[str, Any]) -> None:
        with self._lock:
            if ev.get("level"):
                self._state["level"] = ev["level"]
            if "rank" in ev and ev.get("total"):
                self._state["ranks"][int(ev["rank"])] = (int(ev.get("done", 0)), int(ev["total"]),
                                                         str(ev.get("step", "")))
            if ev.get("message"):
                self._state["lines"] = (self._state["lines"] + [str(ev["message"])])[-12:]
        self._refresh()

    def request(self) -> EvalRequest:
        return EvalRequest(candidate_code=self.sources[self.candidate.value],
                           workload_dir=str(self.workload.directory), params=dict(self._presets[self.preset.value]),
                           world_size=int(self.ranks.value), backend=str(self.backend.value), iters=self.iters,
                           label=str(self.candidate.value), timeline=True)

    def run(self) -> threading.Thread:
        """Start one evaluation in a worker thread and return at once."""
        if self._thread is not None and self._thread.is_alive():
            self.level.value = "<b>busy:</b> an evaluation is already running in this cell"
            return self._thread
        req = self.request()
        with self._lock:
            self._state = {"level": "starting", "ranks": {}, "lines": []}
        self.button.disabled = True
        self._thread = threading.Thread(target=self._work, args=(req,), daemon=True, name="cuco-evalcell")
        self._thread.start()
        return self._thread

    def _work(self, req: EvalRequest) -> None:
        try:
            res = self.evaluator.evaluate(req, self._progress)
        except Exception as exc:  # noqa: BLE001 - misuse (bad workload, bad request): show it, keep the cell usable
            res = EvalResult(level_reached="L0", verdict="error", reason=f"{type(exc).__name__}: {exc}")
        row = {"candidate": req.label, "ranks": req.world_size, "backend": req.backend,
               "sizes": self.preset.value, "level": res.level_reached, "verdict": res.verdict,
               "median_ms": res.median_ms, "spread_ms": res.spread_ms, "seed_ms": res.seed_median_ms,
               "device_ms": timing_medians(res.timing)[1], "e2e_ms": timing_medians(res.timing)[2],
               "speedup": res.speedup, "speedup_ci": res.speedup_ci, "claim": claim(res.speedup, res.speedup_ci),
               "flagged": res.flagged, "badge": res.badge, "reason": res.reason,
               "checked": checked_against(res.oracle),
               "gpu": res.provenance.get("gpu")}
        with self._lock:
            self.results.append(row)
            self._state["level"] = f"{res.level_reached}: {res.verdict}"
            self._state["lines"] = (self._state["lines"] + [t[-400:] for t in res.logs.values()] +
                                    ([res.reason] if res.reason else []))[-12:]
            self._state["summary"] = (f"{res.level_reached}: {res.verdict}"
                                      + (f", median {fmt_ms(res.median_ms)}" if res.median_ms is not None else "")
                                      + (f", {ratio_text(res.speedup, res.speedup_ci)} the seed"
                                         if res.speedup is not None else "")
                                      + (f": {res.reason}" if res.reason else ""))
            self._state["badge"] = (res.badge, provenance_detail(res.provenance))
        self.button.disabled = False
        if res.timeline:
            self.timeline_box.children = [TimelineView(res.timeline, res.badge, provenance_detail(res.provenance))]
        self._refresh.flush()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- UI side ---------------------------------------------------------------------------------------------
    def _render(self) -> None:
        with self._lock:
            st = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._state.items()}
            rows = list(self.results)
        badge = badge_html(*st["badge"]) if st.get("badge") else ""
        self.level.value = f"level: <b>{esc(st['level'])}</b> {badge}"
        bars = []
        for rank, (done, total, step) in sorted(st["ranks"].items()):
            bars.append(W.HBox([W.IntProgress(value=done, max=max(total, 1), description=f"rank {rank}"),
                                W.HTML(esc(step))]))
        self.bars.children = bars
        lines = st["lines"]
        last = st.get("summary") or (lines[-1] if lines else "")
        self.summary.value = f"<div style='font-size:12px'>{esc(last)}</div>" if last else ""
        self.log_view.value = ("<pre style='font-size:10px;max-height:160px;overflow:auto'>"
                               + esc("\n".join(lines)) + "</pre>") if lines else ""
        self.log_box.set_title(0, f"full log ({len(lines)} line(s))")
        self.log_box.layout.display = "" if lines else "none"
        self.table.value = self._table_html(rows) if rows else ""

    def _table_html(self, rows: list[dict[str, Any]]) -> str:
        table = self.table_frame(rows).to_html(index=False, escape=True, na_rep="-", border=0)
        return f"<div class='cuco-eval-table' style='overflow-x:auto;max-width:100%;font-size:12px'>{table}</div>"

    def table_frame(self, rows: list[dict[str, Any]] | None = None) -> pd.DataFrame:
        """The results as the cell's table shows them: what a reader compares, narrow enough for the notebook
        (device and end-to-end times, the spread and the full reason are in `frame()` and the log)."""
        df = self.frame(rows)
        if df.empty:
            return df
        out = df[["candidate", "ranks", "backend", "sizes", "level", "verdict"]].copy()
        out["median"] = df["median_ms"].map(fmt_ms)
        out["seed"] = df["seed_ms"].map(fmt_ms)
        out["speed-up"] = [ratio_text(None if x is None or x != x else x, ci)  # with its interval and claim
                           for x, ci in zip(df["speedup"], df["speedup_ci"])]
        out["badge"] = df["badge"]
        out["reason"] = df["reason"].map(lambda r: short(str(r or ""), REASON_CHARS) or "-")
        return out

    def frame(self, rows: list[dict[str, Any]] | None = None) -> pd.DataFrame:
        return pd.DataFrame(self.results if rows is None else rows)

    def close(self) -> None:
        self._refresh.close()
        super().close()
