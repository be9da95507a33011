"""Hostile text in a real browser: names, rationales, diffs, tags, failure reasons, logs, LLM errors, timeline
labels and banners carrying HTML and script payloads are shown as text by every widget, and none of them runs.

The probe notebook (written by this test into the lab's folder) runs a search on the synthetic workload whose
only proposal source writes every payload into what it proposes, with an evaluator that fails every second
program with the payloads as its reason and log, then adds an LLM call whose error and model name are payloads.
The dashboard (approval queue, lineage and latency plots, failures), the ledger, reasoning and timeline views and
a banner draw all of it. Every payload, had it run, would count itself in ``window.__cuco_xss``; the test also
looks for any element a payload would have created and for any dialog, and checks that the payloads are on the
page as text.
"""
from __future__ import annotations

import time
from typing import Any

import nbformat
import pytest

pytestmark = pytest.mark.timeout(360)

# Each payload bumps window.__cuco_xss if a browser ever runs it (in an attribute, a tag, a URL or a frame).
RUN = "window.__cuco_xss=(window.__cuco_xss||0)+1"
PAYLOADS = [
    f'<img src=x onerror="{RUN}">',
    f"<script>{RUN}</script>",
    f'<svg onload="{RUN}"></svg>',
    f'"><img src=x onerror="{RUN}">',
    f"'><img src=x onerror='{RUN}'>",
    f"</textarea><img src=x onerror=\"{RUN}\">",
    f'<a href="javascript:{RUN}">link</a>',
    f'<iframe srcdoc="<script>parent.{RUN}</script>"></iframe>',
    f'<details open ontoggle="{RUN}">',
]
# Elements or attributes only a payload would have made, inside the notebook's outputs.
INJECTED_JS = """() => Array.from(document.querySelectorAll(
  '.jp-OutputArea img[src="x"], .jp-OutputArea [onerror], .jp-OutputArea [onload], .jp-OutputArea [ontoggle], '
  + '.jp-OutputArea iframe[srcdoc], .jp-OutputArea a[href^="javascript"], .jp-OutputArea details[open]'))
  .map(e => e.outerHTML.slice(0, 200))"""

SETUP = f'''
import dataclasses, tempfile
from pathlib import Path
from IPython.display import display
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.events import EventBus
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.novelty import NoveltyConfig
from cuco_kit.search.proposal import Proposal, unified_diff
from cuco_kit.search.synthetic import write_synthetic_workload
from cuco_kit.workbench.smoke import wait_for
from cuco_kit.store import Store
from cuco_kit.workbench import start_search
from cuco_kit.widgets import LedgerView, ReasoningPanel, RunDashboard, TimelineView, banner

PAYLOADS = {PAYLOADS!r}
HOSTILE = " ".join(PAYLOADS)


class HostileSource:
    """Every proposal carries the payloads: name, rationale, tags, and a comment in the code (so in the diff)."""

    name = "hostile"
    kinds = ("diff", "full", "crossover")

    def propose(self, ctx):
        lines = ctx.parent.code.split("\\n")
        at = lines.index("// EVOLVE-BLOCK-START kernel") + 1
        out = []
        for k in range(ctx.n):
            tag = f"{{ctx.generation}}.{{k}}.{{ctx.island}}"
            code = "\\n".join(lines[:at] + [f"// {{tag}} {{HOSTILE}}"] + lines[at:])
            out.append(Proposal(name=f"{{PAYLOADS[(ctx.generation + k) % len(PAYLOADS)]}} {{tag}}",
                                rationale=HOSTILE, diff=unified_diff(ctx.parent.code, code), tags=PAYLOADS[:3],
                                source="llm_diff", parent_id=ctx.parent.id, code=code))
        return out


class HostileEvaluator:
    """The simulated evaluator, but every program whose code has an odd count of payload lines fails with the
    payloads as its reason and its rank log."""

    badge = "simulated"

    def __init__(self):
        self.inner = SimulatedEvaluator(seed=1)

    def evaluate(self, request, progress=None):
        result = self.inner.evaluate(request, progress)
        if request.candidate_code.count(HOSTILE) % 2:
            result = dataclasses.replace(result, verdict="fail", level_reached="L2", reason=HOSTILE,
                                         logs={{"rank0": HOSTILE}}, median_ms=None, speedup=None)
        return result


wl = write_synthetic_workload(Path(tempfile.mkdtemp()) / "wl")
store = Store(Path(tempfile.mkdtemp()) / "xss.db")
cfg = SearchConfig(seed=3, proposals_per_generation=3, gate="manual", budget=BudgetConfig(generations=3),
                   novelty=NoveltyConfig(enabled=False))  # a comment is all a proposal changes
engine = start_search(SearchEngine(wl, store, HostileEvaluator(), [HostileSource()], cfg, EventBus()))
RunDashboard(engine, key="xss")
'''

DECIDE = '''
# Approve all but the newest waiting proposal (it stays in the queue), until the three generations are proposed
# and every approved program is evaluated.
approved = set()


def settle():
    for pid in engine.gate.pending_ids()[:-1]:
        engine.gate.decide(pid, "approved")
        approved.add(pid)
    done = {e["program_id"] for e in store.evaluations(engine.run_id) if e["status"] == "done"}
    return (engine.generation >= 3 and engine.gate.waiting() == 1
            and len(done) == len(engine.population) == 2 + len(approved))  # the seed, the baseline, the approved

wait_for(settle, 120, "the hostile search")
print("programs", len(engine.population))
'''

VIEWS = '''
store.add_llm_call(run_id=engine.run_id, model=PAYLOADS[1], purpose=PAYLOADS[2], prompt_tokens=1,
                   completion_tokens=1, latency_s=0.1, dollars=0.01, ok=False, error=HOSTILE)
display(LedgerView(store, engine.run_id), ReasoningPanel(store, engine.run_id),
        TimelineView([{"rank": PAYLOADS[0], "stream": PAYLOADS[3], "name": HOSTILE, "start_us": 1.0, "dur_us": 5.0}],
                     badge="simulated", detail=PAYLOADS[5]),
        banner(HOSTILE))
print("views drawn")
'''


def _probe_notebook(path: Any) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, DECIDE, VIEWS)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_hostile_text_is_shown_as_text_and_never_runs(lab: Any):
    _probe_notebook(lab.root / "xss_probe.ipynb")
    page = lab.open("xss_probe.ipynb")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        lab.run_all(page, timeout_s=240)
        assert lab.red_boxes(page) == []
        text = page.inner_text("body")
        assert "views drawn" in text and "programs" in text
        time.sleep(3)  # the dashboard redraws on a timer: let it draw what the search did last
        lab.shot(page, "xss_probe")
        shown = page.inner_text("body")
        # the payloads are on the page, as text: the approval queue's names and diffs, reasons, the ledger...
        assert 'onerror="window.__cuco_xss' in shown and "<script>window.__cuco_xss" in shown, shown[:2000]
        assert page.evaluate("() => window.__cuco_xss === undefined"), "a payload ran"
        assert page.evaluate(INJECTED_JS) == []
        assert dialogs == []
        assert not any("__cuco_xss" in e for e in lab.js_errors), lab.js_errors
        lab.kernel(page, "engine.stop(); engine.join(30); store.close()")
    finally:
        lab.close(page)
