"""FigureBox: a plotly figure shown in an ipywidgets Output through JupyterLab's plotly renderer, redrawn whole.

Why not plotly's FigureWidget: since plotly 6 it is an anywidget whose front end first loads a 5 MB module per
widget, and holds every message for the widget until that load is done (it drops them when the load takes over
2 s, "Failed to initialize model"). The figure's data and layout are set after the widget opens, so they travel
in such a message; plotly's view draws once, from what the model holds at that moment, and ignores later
changes of data and layout. On a busy machine the plot stays an empty frame. Here a redraw replaces the Output's
one display output with the whole figure (data and layout in one message, strict JSON: a NaN in a widget message
makes Jupyter drop it), drawn by the renderer that JupyterLab loaded once. `data` and `layout` are those of the
figure shown last.
"""
from __future__ import annotations

import base64
import json
import math
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def strict_json(obj: Any) -> Any:
    """`obj` with arrays (plotly's base64 typed arrays too) as lists and every NaN or infinity as None."""
    if isinstance(obj, dict) and set(obj) >= {"dtype", "bdata"}:
        arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
        shape = obj.get("shape")
        if isinstance(shape, str):
            shape = tuple(int(n) for n in shape.split(","))
        return strict_json(arr.reshape(shape) if shape else arr)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "tolist"):
        items = obj.tolist() if hasattr(obj, "tolist") else obj
        return [strict_json(v) for v in items] if isinstance(items, list) else strict_json(items)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class FigureBox(W.Output):
    def __init__(self, fig: go.Figure | None = None) -> None:
        super().__init__()
        self.figure = go.Figure()
        self._shown = ""
        if fig is not None:
            self.show(fig)

    @property
    def data(self) -> Any:
        return self.figure.data

    @property
    def layout(self) -> Any:
        return self.figure.layout

    def show(self, fig: go.Figure) -> bool:
        """Draw `fig` in place of what is shown; False (nothing sent) when it is the figure already shown."""
        spec = strict_json(fig.to_plotly_json())
        text = json.dumps(spec, sort_keys=True)
        if text == self._shown:
            return False
        self._shown, self.figure = text, fig
        title = fig.layout.title.text or "plotly figure"
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {PLOTLY_MIME: spec, "text/plain": f"<{title}>"}},)
        return True
