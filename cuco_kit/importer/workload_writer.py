"""``workload.py`` for an imported program: tensor specs and size presets from the plan, and the torch reference.

The reference defines correctness, so cuco init never writes one it made up: until a person approves a draft
(their own, or an LLM's that they reviewed), the reference block is a stub that raises with a
``TODO(cuco init)`` line, and `cuco check-workload` reports it. An approved block replaces the stub; it holds the
function ``reference(inputs, params, world)`` and ``TOLERANCE``.
"""
from __future__ import annotations

import re

from cuco_kit.importer.plan import ImportPlan
from cuco_kit.importer.seed_writer import TODO

SEED_FILE = "seed_nccl.cu"
PLAN_FILE = "cuco_plan.json"
ORIGINAL_FILE = "original.cu"
REFERENCE_START = "# --- reference: defines correctness; approved by a person ---"
REFERENCE_END = "# --- end of reference ---"
# A tolerance to start from per output dtype (relative L2 error); the approved reference block sets the real one.
START_TOLERANCE = {"f32": 1e-4, "f16": 5e-3, "bf16": 2e-2, "fp8_e4m3": 1e-1, "i32": 0.0, "i64": 0.0, "u8": 0.0}

STUB = f'''def reference(inputs: Sequence[Mapping[str, Any]], params: Params, world: int) -> list[dict[str, Any]]:
    # {TODO}: write the torch reference: given every rank's inputs (inputs[r][name]), return every rank's
    # expected outputs ({{name: tensor}} per rank). Import torch inside the function; it must run on the CPU.
    raise NotImplementedError("{TODO}: the torch reference in workload.py is not written yet")


TOLERANCE = Tolerance(rel=%s)  # {TODO}: derive it from the dtypes and the reduction lengths'''


def tolerance_for(plan: ImportPlan) -> float:
    outs = [b.dtype for b in plan.tensors() if b.role in ("output", "inout")]
    return max((START_TOLERANCE.get(d, 1e-2) for d in outs), default=1e-2)


def reference_block(text: str) -> str:
    """The approved reference block between its markers (`text` must define reference() and TOLERANCE)."""
    return f"{REFERENCE_START}\n{text.strip()}\n{REFERENCE_END}"


def current_reference(workload_py: str) -> str:
    """The reference block's text in a written workload.py (between the markers)."""
    m = re.search(re.escape(REFERENCE_START) + r"\n(.*?)\n" + re.escape(REFERENCE_END), workload_py, re.DOTALL)
    return m.group(1) if m else ""


def write_workload(plan: ImportPlan, reference: str | None = None) -> str:
    """The text of workload.py. `reference`: an approved reference block body, else the TODO stub."""
    body = reference if reference is not None else STUB % repr(tolerance_for(plan))
    tensors = "\n".join(f'        TensorSpec("{b.name}", "{b.role}", "{b.dtype}", '
                        f"shape=lambda p, w: ({plan.count_python(b)},)),  # {b.ctype}[{b.count}]"
                        for b in plan.tensors())
    presets = {"small": plan.small_sizes(), "default": dict(plan.sizes)}
    return f'''"""{plan.name}: a workload imported by `cuco init` from {plan.program}.

{plan.description}. The plan cuco init read is {PLAN_FILE} (edit it and run `cuco init` again to change the
tensors or sizes); the seed, in the candidate ABI, is {SEED_FILE}; the original program is kept as {ORIGINAL_FILE}.
`cuco check-workload <this folder>` says what is still missing. Tensors are per rank, as flat arrays.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco_kit.workload import Params, TensorSpec, Tolerance, Workload

{reference_block(body)}


WORKLOAD = Workload(
    name={plan.name!r},
    directory=Path(__file__).resolve().parent,
    description={plan.description!r},
    params={dict(plan.sizes)!r},
    tensors=[
{tensors}
    ],
    reference=reference,
    tolerance=TOLERANCE,
    seeds={{"nccl": {SEED_FILE!r}}},
    size_presets={presets!r},  # small: for 2-4 ranks on one GPU
)
'''
