"""BundlePanel: open a run bundle (cuco_kit.workbench.bundle) in a notebook, with no GPU and no LLM.

A path field and an Open button (`load`: not `open`, which is ipywidgets' own and opens the widget's comm); given
a path (notebook 00 passes $CUCO_BUNDLE) it opens at once, so nothing waits for a click. What it draws is
badged replayed, with the GPU, driver and date the run was measured on.
"""
from __future__ import annotations

import ipywidgets as W

from cuco_kit.errors import CucoError
from cuco_kit.workbench.bundle import OpenedBundle, open_bundle

from ._common import badge_html, esc
from .plots import LatencyPlot, LineageTree


class BundlePanel(W.VBox):
    def __init__(self, path: str = "") -> None:
        self.path = W.Text(value=path, placeholder="path/to/run.cucobundle", description="bundle",
                           layout=W.Layout(width="480px"))
        self.button = W.Button(description="Open", icon="folder-open", layout=W.Layout(width="90px"))
        self.status = W.HTML()
        self.views = W.VBox()
        self.opened: OpenedBundle | None = None
        self.button.on_click(lambda _: self.load())
        super().__init__([W.HBox([self.path, self.button]), self.status, self.views])
        if path:
            self.load()
        else:
            self.status.value = ("<i>no bundle given: set CUCO_BUNDLE before starting Jupyter, or type a path "
                                 "(make one with <code>cuco bundle RUN.sqlite -o run.cucobundle</code>)</i>")

    def load(self) -> OpenedBundle | None:
        path = self.path.value.strip()
        if not path:
            self.status.value = "<span style='color:#b71c1c'>type the path of a .cucobundle first</span>"
            return None
        try:
            opened = open_bundle(path)
            run = opened.main_run()
            store = opened.open_store()
        except CucoError as exc:
            self.status.value = f"<span class='cuco-bundle-error' style='color:#b71c1c'>{esc(exc)}</span>"
            self.views.children = []
            return None
        self.opened = opened
        self.status.value = (badge_html("replayed", f"measured on {opened.measured(run)}")
                             + f"<pre class='cuco-bundle-summary'>{esc(opened.summary())}</pre>")
        self.views.children = [LineageTree(store, int(run["id"])), LatencyPlot(store, int(run["id"]))]
        return opened
