"""One import, step by step: plan -> (the user corrects it) -> folder -> LLM port and reference, each approved.

`ImportSession` is what `cuco init` and the ``06_your_kernel`` notebook drive. Nothing reaches the folder that a
person has not seen: the plan is shown (and may be replaced) before `write()`; an LLM's port is checked (every
plan tensor looked up, every NCCL call of the step kept, L1 when nvcc is here) and shown as a diff against the
original before `accept_port`; an LLM's reference draft is run on the CPU and shown before `accept_reference`.
Without an LLM the deterministic port and a TODO reference stub are written, and `check()` lists what is left.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.build import build, for_workload
from cuco_kit.importer.check import WorkloadCheck, check_workload, reference_problems, reference_worlds
from cuco_kit.importer.derive import make_plan
from cuco_kit.importer.plan import ImportPlan, require_consistent
from cuco_kit.importer.seed_writer import own_headers, write_seed
from cuco_kit.importer.workload_writer import (
    ORIGINAL_FILE,
    PLAN_FILE,
    SEED_FILE,
    current_reference,
    write_workload,
)
from cuco_kit.llm import LLMClient, LLMError
from cuco_kit.prompts import render
from cuco_kit.source.patch import extract_code_block, unified_diff
from cuco_kit.source.source_file import read_source
from cuco_kit.workload import load_workload

_PYTHON_BLOCK = re.compile(r"```(?:python|py)\s*\n(?P<body>.*?)```", re.DOTALL)


@dataclass
class Draft:
    """An LLM's port or reference, with what the checks found; `ok` when they found nothing."""

    kind: str  # "port" | "reference"
    answer: str
    code: str | None
    diff: str
    problems: list[str] = field(default_factory=list)
    model: str = ""
    fixture: bool = False

    @property
    def ok(self) -> bool:
        return self.code is not None and not self.problems


class ImportSession:
    def __init__(self, program: str | Path, workload_dir: str | Path, *, llm: LLMClient | None = None,
                 name: str | None = None, plan: ImportPlan | None = None,
                 builder: Callable[..., Any] | None = None) -> None:
        self.program_path = Path(program)
        self.code = read_source(program, "program")
        self.directory = Path(workload_dir)
        self.llm = llm
        self._builder = builder
        self.plan = plan if plan is not None else make_plan(self.code, self.program_path.name, name)
        self.headers = own_headers(self.program_path, self.code)  # inlined into the seed
        self.notes: list[str] = []

    # -- the plan -----------------------------------------------------------------------------------------
    def set_plan(self, plan: ImportPlan | str) -> ImportPlan:
        """Replace the plan (an ImportPlan or its JSON); BadInput when it is inconsistent with the program."""
        p = ImportPlan.from_json(plan, "plan") if isinstance(plan, str) else plan
        require_consistent(p, self.code)
        self.plan = p
        return p

    @property
    def skeleton(self) -> str:
        """The deterministic port of the program under the current plan."""
        return write_seed(self.plan, self.code, self.headers)

    # -- the folder ---------------------------------------------------------------------------------------
    def write(self, *, overwrite: bool = False) -> Path:
        """Write the folder: the plan, the original, the deterministic seed and workload.py (reference stub). A
        plan with problems is written alone (to correct it) and InconsistentPlan lists them all."""
        d = self.directory
        if (d / "workload.py").exists() and not overwrite:
            raise BadInput(f"{d} already holds a workload.py; pass --force (overwrite=True) to replace it")
        d.mkdir(parents=True, exist_ok=True)
        self.plan.save(d / PLAN_FILE)
        require_consistent(self.plan, self.code)
        (d / ORIGINAL_FILE).write_text(self.code, encoding="utf-8")
        (d / SEED_FILE).write_text(self.skeleton, encoding="utf-8")
        (d / "workload.py").write_text(write_workload(self.plan), encoding="utf-8")
        return d

    def check(self, *, compile_seed: bool = True) -> WorkloadCheck:
        return check_workload(self.directory, compile_seed=compile_seed, builder=self._builder)

    # -- the port ---------------------------------------------------------------------------------------
    def port_problems(self, code: str, *, compile_seed: bool = True) -> list[str]:
        """What is wrong with a port: a tensor never looked up, a scratch buffer gone, an NCCL call of the step
        dropped, an ABI entry point missing, a build that fails."""
        problems = [f"tensor {b.name!r} is never looked up (cuco_tensor(ctx, \"{b.name}\")): the port dropped "
                    "a buffer" for b in self.plan.tensors() if not re.search(rf'"{re.escape(b.name)}"', code)]
        problems += [f"scratch buffer {b.name!r} is gone" for b in self.plan.scratch()
                     if not re.search(rf"\b{re.escape(b.name)}\b", code)]
        for f in ("cuco_setup", "cuco_step", "cuco_teardown"):
            if not re.search(rf"\b{f}\s*\(", code):
                problems.append(f"{f} is not defined")
        from cuco_kit.source.analysis import analyze

        try:
            rep = analyze(code, SEED_FILE)
            calls = {c.call for c in rep.collectives + rep.p2p}
            orig = analyze(self.code, self.plan.program)
            want = {c.call for c in orig.collectives + orig.p2p}
            problems += [f"{c} of the step is gone" for c in sorted(want - calls)]
        except BadInput as exc:
            problems.append(str(exc))
        if not problems and compile_seed and (self._builder is not None or shutil.which("nvcc")):
            r = (self._builder or build)(code, "nccl", for_workload(None, self.directory))
            if not r.ok:
                first = next((ln for ln in (r.log or "").splitlines() if "error" in ln), "see the build log")
                problems.append(f"L1: does not compile: {first}")
        return problems

    def propose_port(self, note: str = "") -> Draft:
        """Ask the LLM for the port (the plan's skeleton as its starting point) and check the answer."""
        llm = self._need_llm("port")
        hist = f"\nA person's note on the previous answer: {note}\n" if note else ""
        user = render("import_port", plan=self.plan.to_json(), skeleton=self.skeleton, program=self.code,
                      history=hist)
        answer, model, fixture = self._ask(llm, user, "import.port")
        code = extract_code_block(answer)
        if code is None:
            return Draft("port", answer, None, "", ["the answer has no ```cuda code block"], model, fixture)
        return Draft("port", answer, code, unified_diff(self.code, code, self.plan.program, SEED_FILE),
                     self.port_problems(code), model, fixture)

    def accept_port(self, code: str) -> Path:
        """Write `code` (an approved or edited port) as the seed, after the same checks as any port."""
        problems = self.port_problems(code)
        if problems:
            raise BadInput(f"the port is not accepted: {problems[0]}")
        path = self.directory / SEED_FILE
        path.write_text(code if code.endswith("\n") else code + "\n", encoding="utf-8")
        return path

    # -- the reference ----------------------------------------------------------------------------------
    def reference_problems(self, text: str) -> list[str]:
        """Run a reference block (defines reference() and TOLERANCE) on the CPU at the small preset, in a copy
        of the folder; what is wrong with it."""
        with tempfile.TemporaryDirectory(prefix="cuco-ref-") as tmp:
            (Path(tmp) / "workload.py").write_text(write_workload(self.plan, text), encoding="utf-8")
            try:
                wl = load_workload(tmp)
            except BadInput as exc:
                return [str(exc)]
            params = wl.resolve(wl.size_presets.get("small", {}))
            out = []
            for world in reference_worlds(self.plan):
                out += reference_problems(wl, params, world)
            return out

    def propose_reference(self, note: str = "") -> Draft:
        llm = self._need_llm("reference")
        tensors = "\n".join(f"- {b.name}: {b.role}, {b.dtype}, {b.count}" for b in self.plan.tensors())
        hist = f"\nA person's note on the previous answer: {note}\n" if note else ""
        user = render("import_reference", tensors=tensors, program=self.code, step_start=self.plan.step_start,
                      step_end=self.plan.step_end, step_function=self.plan.step_function, history=hist)
        answer, model, fixture = self._ask(llm, user, "import.reference")
        blocks = _PYTHON_BLOCK.findall(answer)
        if not blocks:
            return Draft("reference", answer, None, "", ["the answer has no ```python code block"], model, fixture)
        code = blocks[-1].strip() + "\n"
        old = current_reference((self.directory / "workload.py").read_text(encoding="utf-8")) \
            if (self.directory / "workload.py").is_file() else ""
        return Draft("reference", answer, code, unified_diff(old, code, "workload.py (now)", "draft"),
                     self.reference_problems(code), model, fixture)

    def accept_reference(self, text: str) -> Path:
        """Write an approved (or edited) reference block into workload.py; BadInput when it does not run."""
        problems = self.reference_problems(text)
        if problems:
            raise BadInput(f"the reference is not accepted: {problems[0]}")
        path = self.directory / "workload.py"
        path.write_text(write_workload(self.plan, text), encoding="utf-8")
        return path

    # -- helpers ----------------------------------------------------------------------------------------
    def _need_llm(self, what: str) -> LLMClient:
        if self.llm is None:
            raise BadInput(f"no LLM configured for the {what}: set OPENAI_API_KEY (or OPENAI_BASE_URL), or fill "
                           "the TODO places by hand")
        return self.llm

    @staticmethod
    def _ask(llm: LLMClient, user: str, purpose: str) -> tuple[str, str, bool]:
        try:
            c = llm.complete([{"role": "user", "content": user}], purpose=purpose, temperature=0.2)
        except LLMError as exc:
            raise BadInput(f"the LLM call for the {purpose.split('.')[-1]} failed: {exc}") from None
        return c.text, c.model, c.fixture

