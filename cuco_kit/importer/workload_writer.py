"""``workload.py`` for an imported program: tensor specs and size presets from the plan, the oracle, and the
torch reference.

The reference defines correctness, so cuco init never writes one it made up: until a person approves a draft
(their own, or an LLM's that they reviewed), the reference block is a stub with a ``TODO(cuco init)`` line and
the workload's oracle is the seed (differential verification: a candidate is compared with the seed's outputs on
the same inputs). Its tolerance is derived from the output dtypes and the reduction lengths of the plan
(`seed_tolerance`), with a comment saying how, and a TODO to confirm it. An approved block replaces the stub and
makes the reference the oracle; it holds ``reference(inputs, params, world)`` and ``TOLERANCE``.
"""
from __future__ import annotations

import math
import re

from cuco_kit.importer.plan import BufferPlan, ImportPlan
from cuco_kit.importer.seed_writer import TODO

SEED_FILE = "seed_nccl.cu"
PLAN_FILE = "cuco_plan.json"
ORIGINAL_FILE = "original.cu"
REFERENCE_START = "# --- reference: defines correctness; approved by a person ---"
REFERENCE_END = "# --- end of reference ---"
# The seed serves both backends: host NCCL, under `symm` through that backend's host-NCCL layer.
SEEDS = {"nccl": SEED_FILE, "symm": SEED_FILE}
# Rounding unit (2^-mantissa bits) of the float dtypes, and how many of them a reordered sum may differ by per
# term summed (in the root of the count of terms).
EPSILON = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7, "fp8_e4m3": 2.0**-3}
ULPS = 4

STUB = f'''def reference(inputs: Sequence[Mapping[str, Any]], params: Params, world: int) -> list[dict[str, Any]]:
    # {TODO}: the torch reference: given every rank's inputs (inputs[r][name]), return every rank's expected
    # outputs ({{name: tensor}} per rank); import torch inside the function, it must run on the CPU. Until one is
    # approved, verification compares a candidate with the seed's outputs (oracle="seed").
    raise NotImplementedError("no torch reference yet: cuco init --llm, notebook 06, or write it here")


%s
TOLERANCE = Tolerance(rel=%r)  # {TODO}: confirm it (derived as the comment above says)'''


def seed_tolerance(plan: ImportPlan) -> tuple[float, str]:
    """The relative tolerance for the seed as oracle, and how it was derived (comment lines). A candidate that
    reorders a sum differs from the seed by a few rounding units per term, growing as the root of the terms: in
    the output dtype for a reducing collective over the ranks, in f32 for what a kernel accumulates. Integer
    outputs (data movement, integer sums) are exact."""
    outs = sorted({b.dtype for b in plan.tensors() if b.role in ("output", "inout")})
    floats = [d for d in outs if d in EPSILON]
    if not floats:
        return 0.0, f"# derived for the seed as oracle: the outputs are integers ({', '.join(outs)}): exact"
    ranks, terms = plan.summed_terms["collective"], plan.summed_terms["kernel"]
    worst = max(floats, key=lambda d: EPSILON[d])
    rel = ULPS * (EPSILON[worst] * math.sqrt(ranks) + EPSILON["f32"] * math.sqrt(terms))
    return float(f"{rel:.3g}"), (
        f"# derived for the seed as oracle: {ULPS} rounding units x (sqrt({ranks}) ranks a collective sums in "
        f"{worst}\n# + sqrt({terms}) terms a step kernel sums in f32), the plan's summed_terms")


def reference_block(text: str) -> str:
    """The approved reference block between its markers (`text` must define reference() and TOLERANCE)."""
    return f"{REFERENCE_START}\n{text.strip()}\n{REFERENCE_END}"


def current_reference(workload_py: str) -> str:
    """The reference block's text in a written workload.py (between the markers)."""
    m = re.search(re.escape(REFERENCE_START) + r"\n(.*?)\n" + re.escape(REFERENCE_END), workload_py, re.DOTALL)
    return m.group(1) if m else ""


def write_workload(plan: ImportPlan, reference: str | None = None) -> str:
    """The text of workload.py. `reference`: an approved reference block body (the reference is then the
    oracle), else the TODO stub (the seed is the oracle)."""
    if reference is None:
        rel, how = seed_tolerance(plan)
        body = STUB % (how, rel)
    else:
        body = reference
    oracle = "seed" if reference is None else "reference"

    def shape(b: BufferPlan) -> str:
        count = plan.count_python(b)
        return f"_on(w, {count})" if plan.worlds else f"({count},)"

    tensors = "\n".join(f'        TensorSpec("{b.name}", "{b.role}", "{b.dtype}", shape=lambda p, w: {shape(b)}),  '
                        f"# {b.ctype}[{b.count}]" for b in plan.tensors())
    presets = {"small": plan.small_sizes(), "default": dict(plan.sizes)}
    worlds = "" if not plan.worlds else f'''
WORLDS = {tuple(plan.worlds)!r}  # the world sizes {plan.program} runs on (it refuses the others)


def _on(w: int, n: int) -> tuple[int]:
    """(n,): a flat tensor of n elements, on a world size the program runs on (BadInput on the others)."""
    if w not in WORLDS:
        raise BadInput(f"{plan.name} runs on {{', '.join(map(str, WORLDS))}} rank(s) only, not {{w}}")
    return (n,)

'''
    errors = "\nfrom cuco_kit.errors import BadInput" if plan.worlds else ""
    return f'''"""{plan.name}: a workload imported by `cuco init` from {plan.program}.

{plan.description}. The plan cuco init read is {PLAN_FILE} (edit it and run `cuco init` again to change the
tensors or sizes); the seed, in the candidate ABI, is {SEED_FILE}; the original program is kept as {ORIGINAL_FILE}.
`cuco check-workload <this folder>` says what is still missing. Tensors are per rank, as flat arrays.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
{errors}
from cuco_kit.workload import Params, TensorSpec, Tolerance, Workload
{worlds}
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
    seeds={SEEDS!r},
    size_presets={presets!r},  # small: for 2-4 ranks on one GPU
    oracle={oracle!r},  # "seed": a candidate is checked against the seed's outputs until a reference is approved
)
'''
