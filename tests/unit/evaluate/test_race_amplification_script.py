"""benchmarks/harness/race_amplification.py's bookkeeping on the CPU, with a fake evaluator: which evaluations the
one device command runs under which perturbation, what its JSON says per race class, per perturbation alone and per
honest run, the cost table, and that a spent budget is reported rather than hidden."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig

ROOT = Path(__file__).resolve().parents[3]
KNOBS = ("stress", "jitter_us", "interference", "race_size")


def _script() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("race_amplification_under_test",
                                                  ROOT / "benchmarks" / "harness" / "race_amplification.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Pool:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def close(self) -> None:
        self.log.append("close")


class _Evaluator:
    """Rejects a race class at two ranks whenever any perturbation is on (at the race-check size when that is the
    one), passes everything else, and logs what it was asked under which knobs."""

    def __init__(self, cfg: EvaluatorConfig) -> None:
        self.cfg = cfg
        self.log: list[str] = []
        self.requests: list[tuple[EvalRequest, dict[str, Any]]] = []
        self.pool = _Pool(self.log)

    def prebuild(self, req: EvalRequest) -> bool:
        return True

    def evaluate(self, req: EvalRequest) -> EvalResult:
        knobs = {k: getattr(self.cfg, k) for k in KNOBS}
        self.requests.append((req, knobs))
        self.log.append(req.label)
        racy = "tests/data/adversarial" in req.candidate_code or "race:" in req.candidate_code
        if racy and req.world_size > 1 and any(knobs.values()):
            where = "at the race-check size (preset 'x'): " if knobs == {**{k: False for k in KNOBS},
                                                                         "jitter_us": 0.0, "race_size": True} else ""
            return EvalResult("L2", "fail", where + "verification failed: rank 0", provenance={"eval_seconds": 0.1})
        race = {"seconds": 0.5, "preset": "x"} if knobs["race_size"] and req.world_size > 1 else None
        prov = {"l2_seconds": 0.25, "eval_seconds": 1.0, "l2_stress": knobs["stress"], "notes": []}
        if race:
            prov["race_size"] = race
        return EvalResult("L3", "pass", median_ms=1.0, provenance=prov)

    def close(self) -> None:
        pass


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Any:
    mod = _script()
    made: list[_Evaluator] = []

    def evaluator(cfg: EvaluatorConfig) -> _Evaluator:
        made.append(_Evaluator(cfg))
        return made[-1]

    monkeypatch.setattr(mod, "GpuEvaluator", evaluator)
    monkeypatch.setattr(mod, "detect_gpu", lambda: [{"name": "FAKE", "driver_version": "0"}])
    monkeypatch.setattr(mod, "git_revision", lambda: "test")
    # the race classes' sources are read from disk: mark them so the fake knows a race when it sees one
    real_read = Path.read_text

    def read_text(self: Path, *a: Any, **k: Any) -> str:
        text = real_read(self, *a, **k)
        return f"// race: {self}\n{text}" if self.parent == mod.ADV and self.suffix == ".cu" else text

    monkeypatch.setattr(Path, "read_text", read_text)
    mod.made = made
    return mod


def test_each_perturbation_alone_toggles_exactly_one_knob(script: Any) -> None:
    on = {k: getattr(EvaluatorConfig(), k) for k in KNOBS}
    assert script.CONFIGS["all"] == on and all(on.values())
    assert not any(script.CONFIGS["none"].values())
    alone = {n: c for n, c in script.CONFIGS.items() if n not in ("all", "none")}
    assert len(alone) == 4
    for c in alone.values():
        assert [k for k in KNOBS if c[k]] and len([k for k in KNOBS if c[k]]) == 1
        assert all(c[k] == on[k] for k in KNOBS if c[k])


def test_one_command_measures_every_class_every_honest_run_the_cost_and_each_alone(script: Any,
                                                                                   tmp_path: Path) -> None:
    rc = script.main(["--out", str(tmp_path), "--seeds", "3", "--cost-seeds", "1", "--alone-seeds", "2",
                      "--budget-s", "600"])
    out = json.loads((tmp_path / "race_amplification.json").read_text())
    assert rc == 0 and out["detection_ok"] and out["honest_ok"] and not out["skipped"]
    races = script.race_classes()
    assert {d["file"] for d in out["detection"].values()} == set(races)
    assert all(d["caught"] == d["evaluated"] == 3 and d["config"] == "all" for d in out["detection"].values())
    honest = {(r["workload"], r["file"], r["world"]) for r in out["honest"]}
    for wl in script.WORKLOADS:
        assert {(wl, f, w) for f in script.HONEST for w in (1, 2, 4)} <= honest
    assert {(c["workload"].name, f, 1) for f, c in races.items()} <= honest  # every race class passes at 1 rank
    assert not any(r["file"] in races and r["world"] > 1 for r in out["honest"])
    summary = out["cost"]["summary"]
    assert set(summary) == {"allgather", "gemm_allgather"} and set(summary["allgather"]) == set(script.CONFIGS)
    assert summary["allgather"]["all"]["l2_total_seconds"] == 0.75 and summary["allgather"]["none"][
        "l2_total_seconds"] == 0.25
    raw = sorted(f for f, c in races.items() if c["raw"])
    assert {k.split("|")[0] for k in out["alone"]} == set(raw)
    assert out["alone"][f"{raw[0]}|race-check size"]["caught_at_race_size"] == 2
    ev = script.made[0]
    # at most one workload's worlds at a time: every block ends its worlds before the next workload's first request
    last = None
    for entry in ev.log:
        if entry == "close":
            last = None
            continue
        wl = next((w for w in script.WORKLOADS if entry.startswith(f"{w}/") or entry.split(" ")[0] in
                   {f for f, c in races.items() if c["workload"].name == w}), None)
        assert last in (None, wl), (last, entry)
        last = wl


def test_a_spent_budget_is_reported_not_hidden(script: Any, tmp_path: Path) -> None:
    rc = script.main(["--out", str(tmp_path), "--seeds", "2", "--budget-s", "0", "--alone-seeds", "1"])
    out = json.loads((tmp_path / "race_amplification.json").read_text())
    assert rc == 1 and out["skipped"] and not out["detection_ok"]
