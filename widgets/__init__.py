"""Notebook widgets for cuco-kit, imported as ``cuco_kit.widgets``.

Small composable views over the engine; none holds engine logic. Every LLM- or candidate-produced string is
escaped before it reaches HTML, and every view shows the data's badge (real, replayed, SIMULATED).
"""
from .dashboard import RunDashboard
from .diff_review import DiffReview, side_by_side_html
from .eval_cell import EvalCell
from .notebook import Banner, banner, review_attempts
from .plots import DesignSpaceMap, LatencyPlot, LineageTree
from .reasoning import ReasoningPanel
from .slots import SlotPanel
from .views import AnalysisView, LedgerView, TimelineView

__all__ = ["AnalysisView", "Banner", "DesignSpaceMap", "DiffReview", "EvalCell", "LatencyPlot", "LedgerView",
           "LineageTree", "ReasoningPanel", "RunDashboard", "SlotPanel", "TimelineView", "banner", "review_attempts",
           "side_by_side_html"]
