"""Notebook widgets for cuco-kit, imported as ``cuco_kit.widgets``.

Small composable views over the engine; none holds engine logic. Every LLM- or candidate-produced string is
escaped before it reaches HTML, and every view shows the data's badge (cuco_kit.workbench.badges: real, replayed,
simulated, fixture, model).
"""
from .approval_queue import ApprovalQueue
from .attempt_review import FastPathStepper
from .bundle_panel import BundlePanel
from .chunk_explorer import ChunkExplorer
from .dashboard import RunDashboard
from .diff_review import DiffReview, side_by_side_html
from .eval_cell import EvalCell
from .exercise_cell import ExerciseCell
from .notebook import Banner, banner, review_attempts, short_errors
from .plan_form import DraftReview, PlanForm
from .plots import DesignSpaceMap, LatencyPlot, LineageTree
from .reasoning import ReasoningPanel
from .slots import SlotPanel
from .views import AnalysisView, FailureView, LedgerView, TimelineView

__all__ = ["AnalysisView", "ApprovalQueue", "Banner", "BundlePanel", "ChunkExplorer", "DesignSpaceMap", "DiffReview",
           "DraftReview", "EvalCell", "ExerciseCell", "FailureView", "FastPathStepper", "LatencyPlot", "LedgerView",
           "LineageTree", "PlanForm", "ReasoningPanel", "RunDashboard", "SlotPanel", "TimelineView", "banner",
           "review_attempts", "short_errors", "side_by_side_html"]
