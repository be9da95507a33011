"""One program of a run as HTML: its name, rationale, latest evaluation's numbers and its diff against its parent.

What the lineage's "program" menu (and a click in the dashboard) opens. Names, rationales and reasons come from
an LLM or a candidate, so all of it goes through `esc`; the diff's source is escaped by pygments.
"""
from __future__ import annotations

from typing import Any

from cuco_kit.evaluate.api import checked_against
from cuco_kit.store import Store
from cuco_kit.workbench.report import ratio_text

from ._common import esc, fmt_ms
from .budget_approval import program_info_html
from .diff_review import side_by_side_html


def program_detail_html(store: Store, program_id: int) -> str:
    """Program `program_id`'s header, metrics (or "not evaluated yet"), overlap and cost, and side-by-side diff vs
    its parent."""
    p = store.program(program_id)
    parent_id = p.get("parent_id")
    parent = store.program(int(parent_id)) if parent_id else None
    evs = store.evaluations(program_id=program_id)
    last: dict[str, Any] = dict(evs[-1]) if evs else {}
    result = last.get("result") or {}
    metrics = (f"verdict <b>{esc(last.get('verdict'))}</b> at {esc(last.get('level_reached'))}; "
               f"median {fmt_ms(last.get('median_ms'))}; speed-up over the seed "
               f"{esc(ratio_text(last.get('speedup'), result.get('speedup_ci')))}"
               + (f"; {esc(checked_against(result.get('oracle')))}" if result.get("oracle") else "")
               + (f"; reason {esc(last.get('reason'))}" if last.get("reason") else "")) \
        if last else "not evaluated yet"
    against = (f"diff against its parent, program {int(parent['id'])}" if parent
               else "no parent: the whole program is shown as added")
    return (f"<div class='cuco-program-detail'><h4>program {program_id}: {esc(p.get('name'))} "
            f"({esc(p.get('source'))})</h4><div>{esc(p.get('rationale'))}</div><div>{metrics}</div>"
            + program_info_html(store, int(p["run_id"]), program_id)
            + f"<div style='color:#666'>{against}</div>"
            + side_by_side_html(parent["code"] if parent else "", p["code"]) + "</div>")
