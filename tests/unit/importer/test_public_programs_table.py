"""The table of benchmarks/importer/public_programs.py: which outcome a program's command results give, what the
cells say, and how plan corrections are applied and named. Rows are made up here; no public code is involved."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pp() -> Any:
    spec = importlib.util.spec_from_file_location("public_programs_under_test",
                                                  ROOT / "benchmarks" / "importer" / "public_programs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _row(pp: Any, **kw: Any) -> Any:
    return pp.Row("prog", "owner/repo:main.cu@abcdef0", **kw)


def _imported(pp: Any, **kw: Any) -> Any:
    return _row(pp, plan_only=pp.Step(0, "wrote plan"), plan_written=True, imported=pp.Step(0, "wrote"),
                builds={"nccl": "ok", "symm": "skipped: no compat header"}, **kw)


def test_outcomes_follow_the_commands(pp: Any) -> None:
    assert pp.outcome(_row(pp, present=False)) == (pp.MISSING, "not in the folder")
    refused = _row(pp, plan_only=pp.Step(2, "cuco init: x.cu: no loop"))
    assert pp.outcome(refused) == (pp.NOT_IMPORTED, "cuco init: x.cu: no loop")
    control = _row(pp, control="no collective", plan_only=pp.Step(2, "cuco init: no NCCL calls"))
    assert pp.outcome(control)[0] == pp.CONTROL
    crashed = _row(pp, control="no collective", plan_only=pp.Step(1, "ImportError: cannot import name x"))
    assert pp.outcome(crashed) == (pp.NOT_IMPORTED, "exit 1: ImportError: cannot import name x")
    assert pp.outcome(_imported(pp)) == (pp.NO_EDIT, "")
    assert pp.outcome(_imported(pp, corrected=["buffers", "step_end"])) == (pp.CORRECTED,
                                                                            "corrected: buffers, step_end")
    broken = _imported(pp)
    broken.builds["nccl"] = "failed: seed_nccl.cu(3): error: identifier x is undefined"
    assert pp.outcome(broken) == (pp.NO_BUILD, broken.builds["nccl"])


def test_a_refused_plan_gives_its_problems(pp: Any) -> None:
    step = pp.Step(2, "cuco init: 2 problem(s) in the plan: correct it", ["no buffer is an output", "size 'n': 0"])
    assert pp.outcome(_row(pp, plan_only=step, plan_written=True)) == (
        pp.NOT_IMPORTED, "no buffer is an output; size 'n': 0")


def test_an_import_that_leaves_more_than_the_reference(pp: Any) -> None:
    row = _imported(pp, corrected=["buffers"], left=[
        "reference: not written yet (workload.py): write reference() there",
        "tolerance: rel=4.08e-05, derived from the output dtypes: confirm it",
        "seed_nccl.cu:7: TODO(cuco init): the step runs on stream 's[0]'; make its work use ctx->stream"])
    assert pp.outcome(row) == (pp.MORE_LEFT, "corrected: buffers; seed_nccl.cu:7: TODO(cuco init): the step runs "
                                             "on stream 's[0]'; make its work use ctx->stream")
    assert pp.outcome(_imported(pp, left=row.left[:2])) == (pp.NO_EDIT, "")


def test_a_refused_import_names_the_plan_fields_left_to_correct(pp: Any) -> None:
    row = _row(pp, plan_only=pp.Step(2, "plan inconsistent"), plan_written=True, plan_todos=["buffers.1.count"],
               imported=pp.Step(2, "cuco init: the plan is inconsistent"))
    what, why = pp.outcome(row)
    assert what == pp.NOT_IMPORTED
    assert why == "plan needs a correction of buffers.1.count: cuco init: the plan is inconsistent"


def test_todo_fields_and_corrections(pp: Any) -> None:
    plan = {"name": "p", "buffers": [{"name": "a", "count": "n"}, {"name": "b", "count": "TODO: unknown size"}],
            "step_start": "TODO(cuco init): which loop", "world": "nranks"}
    assert pp.todo_fields(plan) == ["buffers.1.count", "step_start"]
    fixed, changed = pp.apply_corrections(plan, {"step_start": 12, "world": "nranks"})
    assert changed == ["step_start"]  # an unchanged value is not a correction
    assert fixed["step_start"] == 12 and fixed["buffers"] == plan["buffers"]
    assert plan["step_start"].startswith("TODO")  # the analysis's plan is kept as it was


def test_left_cell_groups_the_expected_reference_and_tolerance(pp: Any) -> None:
    row = _imported(pp, left=[
        "workload.py:17: TODO(cuco init): write the torch reference: given every rank's inputs",
        "workload.py:22: TOLERANCE = Tolerance(rel=0.0001) # TODO(cuco init): derive it from the dtypes",
        "reference on 1 rank(s): the reference raised NotImplementedError",
        "seed_nccl.cu: never looks up tensor(s) x"])
    assert pp.left_cell(row) == "reference; tolerance; seed_nccl.cu: never looks up tensor(s) x"
    assert pp.left_cell(_imported(pp)) == "nothing"
    assert pp.left_cell(_row(pp, plan_only=pp.Step(2, "no"))) == "-"


def test_markdown_table_is_one_line_per_program(pp: Any) -> None:
    rows = [_imported(pp), _row(pp, plan_only=pp.Step(None, "timed out | after 600 s\nkilled"))]
    table = pp.markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.startswith("| ") and line.endswith(" |") for line in table)
    assert "timed out \\| after 600 s killed" in table[3]  # pipes escaped, newlines folded
    assert "| timed out |" in table[3]  # the plan-only cell of a command that did not finish
    assert pp.summary(rows) == f"1 {pp.NO_EDIT}, 1 {pp.NOT_IMPORTED}"
