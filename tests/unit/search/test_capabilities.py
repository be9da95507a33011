"""Optional capabilities are Protocols the engine narrows with isinstance, not attributes it probes for: the
search engine holds no getattr probe, and each implementation is recognised by the capability it really has."""
from __future__ import annotations

import ast
from pathlib import Path

import cuco_kit
from cuco_kit.evaluate.api import (
    Badged,
    Closable,
    HasRecordings,
    Prebuilds,
    Sanitizes,
    badge_of,
    close_evaluator,
)
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.evaluate.simulated import SimulatedEvaluator
from cuco_kit.llm.scripted import ScriptedClient
from cuco_kit.search.design_space import DesignSpaceSource
from cuco_kit.search.engine import BindsLedger
from cuco_kit.search.human import HumanSource
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.search.proposal import BindsEngine, HasClient, RepairsBuilds

PACKAGE = Path(cuco_kit.__file__).parent


def _getattr_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]


def test_the_engine_and_its_executors_probe_nothing():
    for rel in ("search/engine.py", "search/executor.py", "search/slots.py", "fastpath/sanitizer.py"):
        assert _getattr_calls(PACKAGE / rel) == [], f"{rel} probes with getattr/hasattr"


def test_evaluator_capabilities_are_recognised():
    sim = SimulatedEvaluator(seed=0)
    assert isinstance(sim, Badged) and badge_of(sim) == "simulated"
    assert isinstance(sim, Prebuilds) and not isinstance(sim, Sanitizes) and not isinstance(sim, HasRecordings)
    # the GPU evaluator's capabilities, read from its class (making one starts a worker pool)
    assert issubclass(GpuEvaluator, Prebuilds) and issubclass(GpuEvaluator, Sanitizes)
    assert issubclass(GpuEvaluator, Closable) and not issubclass(GpuEvaluator, HasRecordings)


class _Bare:
    def evaluate(self, request, progress=None):  # the one method every evaluator has
        raise AssertionError("not called")


class _Ledgered(_Bare):
    def __init__(self) -> None:
        self.bound: list[object] = []

    def bind_ledger(self, ledger) -> None:
        self.bound.append(ledger)

    def close(self) -> None:
        self.bound.append("closed")


def test_a_bare_evaluator_measures_and_has_nothing_to_close():
    bare = _Bare()
    assert badge_of(bare) == "real"
    assert not isinstance(bare, (Prebuilds, Sanitizes, Closable, BindsLedger, HasRecordings))
    close_evaluator(bare)  # nothing to release: no error
    led = _Ledgered()
    assert isinstance(led, BindsLedger)
    close_evaluator(led)
    assert led.bound == ["closed"]


def test_source_capabilities_are_recognised():
    llm = LLMSource(ScriptedClient([]))
    assert isinstance(llm, BindsEngine) and isinstance(llm, RepairsBuilds) and isinstance(llm, HasClient)
    human = HumanSource()
    assert not isinstance(human, (BindsEngine, RepairsBuilds, HasClient))
    ds = DesignSpaceSource()
    assert not isinstance(ds, (RepairsBuilds, HasClient))
