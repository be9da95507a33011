"""CPU checks of the race-check size (cuco_kit/evaluate/race_size.py) and of its place in the evaluator: which
preset the rule picks for each sample, when it picks none and says why, the command it sends, how a failure there
becomes the evaluation's verdict, and that GpuEvaluator sends it to a world of its own only after a pass."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from cuco_kit.evaluate import race_size as R
from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.gpu_evaluator import EvaluatorConfig, GpuEvaluator
from cuco_kit.workload import TensorSpec, Workload, load_workload

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_kernels"
RULE = {"min_bytes": 8 << 20, "max_gpu_bytes": 2 << 30}


def _pick(name: str, preset: str, world: int, backend: str = "symm", **rule: int) -> tuple[R.RaceSize | None, str]:
    wl = load_workload(SAMPLES / name)
    return R.pick(wl, wl.check(wl.size_presets[preset], world), world, **{**RULE, **rule},
                  ranks_per_gpu=world if backend == "symm" else 1)


@pytest.mark.parametrize("name, world, want", [
    ("gemm_allgather", 2, "4096"), ("gemm_allgather", 4, "4096"), ("allgather", 2, "default"),
    ("allgather", 4, "default"), ("kv_transfer", 2, "default"), ("kv_transfer", 4, "default"),
    # three presets move 16 MiB at 2 ranks: "paper" differs from "small" in two parameters, the others in three
    ("attention_cp", 2, "paper")])
def test_the_smallest_preset_that_moves_enough_is_picked(name: str, world: int, want: str) -> None:
    race, why = _pick(name, "small", world)
    assert race is not None and not why
    assert race.preset == want and race.traffic_bytes >= RULE["min_bytes"] > race.request_traffic_bytes
    wl = load_workload(SAMPLES / name)
    assert race.params == wl.check(wl.size_presets[want], world)


def test_a_request_that_moves_enough_needs_no_second_size() -> None:
    assert _pick("gemm_allgather", "4096", 2) == (None, "")
    assert _pick("allgather", "small", 2, min_bytes=1 << 20) == (None, "")  # 2 MiB already races under this rule
    wl = load_workload(SAMPLES / "allgather")
    assert R.pick(wl, wl.resolve(wl.size_presets["tiny"]), 1, **RULE, ranks_per_gpu=1) == (None, "")  # world 1


def test_no_preset_within_the_memory_cap_is_said_so() -> None:
    race, why = _pick("moe_dispatch_combine", "small", 2)  # its large presets need GiBs of experts per rank
    assert race is None
    assert "requested size only" in why and "dsv3_e32" in why and "MiB of tensors per GPU" in why
    race, why = _pick("gemm_allgather", "small", 4, max_gpu_bytes=64 << 20)  # symm: four ranks share the GPU
    assert race is None and "4096" in why
    race, _ = _pick("gemm_allgather", "small", 4, "nccl", max_gpu_bytes=64 << 20)  # nccl: a GPU per rank
    assert race is not None and race.preset == "4096"


def _outputs_only(presets: dict[str, dict[str, int]]) -> Workload:
    return Workload(name="copy", directory=ROOT, description="", params={"N": 1024},
                    tensors=[TensorSpec("x", "input", "f32", lambda p, w: (p["N"],)),
                             TensorSpec("y", "output", "f32", lambda p, w: (w * p["N"],))],
                    reference=lambda inputs, p, w: [], size_presets=presets)


def test_without_comm_bytes_the_peers_share_of_the_outputs_counts() -> None:
    wl = _outputs_only({})
    assert R.traffic_bytes(wl, {"N": 1024}, 4) == 4 * 1024 * 4 * 3 / 4  # y: 4 ranks x 1024 f32, 3/4 from peers
    assert R.traffic_bytes(load_workload(SAMPLES / "allgather"), {"N_PER_RANK": 1 << 20}, 2) == 2 << 20
    race, why = R.pick(wl, {"N": 1024}, 2, **RULE, ranks_per_gpu=2)
    assert race is None and "no size preset of copy" in why
    race, _ = R.pick(_outputs_only({"big": {"N": 4 << 20}, "bigger": {"N": 16 << 20}}), {"N": 1024}, 2, **RULE,
                     ranks_per_gpu=2)
    assert race is not None and race.preset == "big"


CMD = {"op": "eval", "so_path": "/c/plain.so", "iters": 20, "warmup": 3, "verify_every": 3, "trials": 3, "seed": 4,
       "oracle_key": "k", "timeline": True, "stress": {"so_path": "/c/stress.so", "max_delay_ns": 1, "permille": 2}}
RACE = R.RaceSize("4096", {"M": 4096, "N": 4096, "K": 4096}, 16.0 * (1 << 20), 1.0 * (1 << 20))


def test_the_race_command_runs_the_trials_once_on_the_stress_build() -> None:
    c = R.command(CMD, RACE, 30.0)
    assert c["so_path"] == "/c/stress.so" and c["stress"] == CMD["stress"]  # one library: trials stressed
    assert (c["iters"], c["warmup"], c["capture"], c["timeline"], c["step_limit_s"]) == (1, 0, False, False, 30.0)
    assert c["trials"] == 3 and c["seed"] == 4 and c["oracle_key"] == "k:race:4096"
    seed = R.command({k: v for k, v in CMD.items() if k != "stress"}, RACE, 30.0)
    assert seed["so_path"] == "/c/plain.so" and "stress" not in seed


def _pass(**prov: Any) -> EvalResult:
    return EvalResult("L3", "pass", median_ms=1.0, provenance={"notes": [], **prov})


def test_a_failure_at_the_race_size_fails_the_evaluation_and_names_the_size() -> None:
    sent: list[tuple[dict[str, int], dict[str, Any]]] = []

    def run(params: dict[str, int], cmd: dict[str, Any]) -> EvalResult:
        sent.append((params, cmd))
        return EvalResult("L2", "fail", "verification failed: rank 0: output 'y' wrong in verification trial 2/3",
                          max_rel_err=0.3, provenance={"notes": ["n"], "_flags": ""})

    res = R.verify(_pass(), RACE, CMD, None, 30.0, run)
    assert [p for p, _ in sent] == [RACE.params] and sent[0][1]["oracle_key"] == "k:race:4096"
    assert res.verdict == "fail" and res.level_reached == "L2" and res.median_ms is None
    assert res.reason.startswith("at the race-check size (preset '4096': K=4096, M=4096, N=4096): verification")
    assert res.provenance["race_size"]["preset"] == "4096" and res.provenance["race_size"]["verdict"] == "fail"


def test_a_pass_at_the_race_size_keeps_the_scores_and_says_where_l2_ran() -> None:
    res = R.verify(_pass(l2_seconds=0.2), RACE, CMD, None, 30.0,
                   lambda p, c: EvalResult("L3", "pass", median_ms=9.0, provenance={"l2_seconds": 0.5}))
    assert res.verdict == "pass" and res.median_ms == 1.0 and res.provenance["l2_seconds"] == 0.2
    info = res.provenance["race_size"]
    assert info["l2_seconds"] == 0.5 and info["traffic_mib"] == 16.0 and info["request_traffic_mib"] == 1.0
    assert any("race-check size (preset '4096'" in n for n in res.provenance["notes"])


def test_the_seed_runs_first_at_the_race_size_when_it_is_the_oracle() -> None:
    roles: list[str] = []

    def run(params: dict[str, int], cmd: dict[str, Any]) -> EvalResult:
        roles.append(cmd["role"])
        return EvalResult("L3", "pass", median_ms=1.0)

    seed_cmd = {"op": "eval", "so_path": "/c/seed.so", "role": "seed", "oracle_key": "k", "iters": 20}
    R.verify(_pass(), RACE, {**CMD, "role": "candidate"}, seed_cmd, 30.0, run)
    assert roles == ["seed", "candidate"]
    res = R.verify(_pass(), RACE, {**CMD, "role": "candidate"}, seed_cmd, 30.0,
                   lambda p, c: EvalResult("L2", "fail", "verification failed"))
    assert res.verdict == "error" and "the workload's seed (the oracle) did not pass at the race-check" in res.reason


# ------------------------------------------------------------------------------------ in the evaluator

class _Pool:
    """WorkerPool as _run_gpu uses it: a warm group per key, never a process."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.starts = 0

    def group(self, key: str, make_spec: Any, progress: Any = None, on_recycle: Any = None,
              fingerprint: str = "") -> Any:
        self.keys.append(key)
        return NS(started_s=0.0, isolation=None, info=[], key=key)

    def close(self) -> None:
        pass


def _evaluator(tmp_path: Path, verdicts: dict[str, str], **cfg: Any) -> tuple[GpuEvaluator, list[dict[str, Any]]]:
    ev = GpuEvaluator(EvaluatorConfig(scratch_root=tmp_path, **cfg))
    ev.pool = _Pool()  # type: ignore[assignment]
    sent: list[dict[str, Any]] = []

    def command(group: Any, cmd: dict[str, Any], progress: Any) -> EvalResult:
        sent.append({**cmd, "_world": group.key})
        where = "race" if ":race:" in cmd.get("oracle_key", "") else "request"
        if verdicts[where] == "pass":
            return EvalResult("L3", "pass", median_ms=1.0, provenance={"notes": [], "_flags": ""})
        return EvalResult("L2", "fail", "verification failed: rank 1: output 'y' changed",
                          provenance={"notes": [], "_flags": ""})

    ev._command = command  # type: ignore[method-assign]
    return ev, sent


def _run(ev: GpuEvaluator, name: str, preset: str, world: int = 2) -> EvalResult:
    wl = load_workload(SAMPLES / name)
    req = EvalRequest(candidate_code="", workload_dir=str(SAMPLES / name), params=wl.size_presets[preset],
                      world_size=world, backend="symm", measure_seed=False)
    return ev._run_gpu(req, wl, wl.resolve(req.params), Path("/c/plain.so"), None, Path("/c/stress.so"), {}, {},
                       [], None)


def test_the_evaluator_checks_a_small_pass_in_the_race_sizes_own_world(tmp_path: Path) -> None:
    ev, sent = _evaluator(tmp_path, {"request": "pass", "race": "fail"})
    res = _run(ev, "gemm_allgather", "small")
    assert [c["oracle_key"].endswith(":race:4096") for c in sent] == [False, True]
    assert sent[0]["_world"] != sent[1]["_world"] and '["K", 4096]' in sent[1]["_world"]
    assert sent[0]["interference"] == {"max_hold_ns": 200_000} and sent[1]["so_path"] == "/c/stress.so"
    assert res.verdict == "fail" and res.reason.startswith("at the race-check size (preset '4096'")
    assert "_flags" not in res.provenance and res.provenance["race_size"]["verdict"] == "fail"


def test_the_evaluator_skips_the_race_size_after_a_failure_when_off_or_when_large_enough(tmp_path: Path) -> None:
    ev, sent = _evaluator(tmp_path, {"request": "fail", "race": "pass"})
    assert _run(ev, "gemm_allgather", "small").reason.startswith("verification failed")
    assert len(sent) == 1
    ev, sent = _evaluator(tmp_path / "off", {"request": "pass", "race": "fail"}, race_size=False, interference=False)
    assert _run(ev, "gemm_allgather", "small").verdict == "pass" and len(sent) == 1
    assert sent[0]["interference"] is None
    ev, sent = _evaluator(tmp_path / "big", {"request": "pass", "race": "fail"})
    assert _run(ev, "gemm_allgather", "4096").verdict == "pass" and len(sent) == 1
    ev, sent = _evaluator(tmp_path / "moe", {"request": "pass", "race": "fail"})
    res = _run(ev, "moe_dispatch_combine", "small")
    assert res.verdict == "pass" and len(sent) == 1
    assert any("requested size only" in n for n in res.provenance["notes"])
