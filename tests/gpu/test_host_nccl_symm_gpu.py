"""Host NCCL under the `symm` backend on a real GPU (runtime/symm_nccl/nccl.h): 2 and 4 ranks sharing ONE GPU run
host-driven programs unchanged, the communicator bound by the harness. Ranks on one GPU check correctness and
contention, not NVLink speed: the medians printed here are no NVLink numbers.

(a) every sample's seed_nccl.cu passes L2 at 2 and 4 ranks at its small preset, and is timed (medians printed);
(b) tests/data/host_nccl/host_nccl_ops.cu, every served call in one step (all-reduce sum/max in f32 and bf16,
    all-gather, reduce-scatter, all-to-all, broadcast, reduce, gather, scatter, a grouped send/recv ring of unequal
    sizes on two streams, send/recv to oneself), matches torch at 2 and 4 ranks, in chunks of 16 KiB and, at the
    `large` preset without that cap, with messages larger than the staging window;
(c) three wrong host-NCCL candidates fail L2 with a reason: a wrong count (poison left), a GEMM that does not wait
    for the all-gather on its side stream (wrong outputs), and a wrong peer, which hangs as it would under real
    NCCL and fails on the harness's watchdog (a timeout).
Budget: about 3 minutes on an H200 when the file runs alone (device_samples.sh host_nccl: builds in parallel first,
one warm world at a time); the medians are only quiet then, since gpu_tier.py runs this file beside the others.
The wrong peer's hang ends with its world killed, so that test is `serial` (out of the shared MPS daemon); the
quick form leaves out the 4-rank seeds and the large preset (`slow`)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuco_kit.evaluate.api import EvalRequest, EvalResult
from cuco_kit.evaluate.device import gpu_present
from cuco_kit.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_kernels"
OPS = ROOT / "tests" / "data" / "host_nccl"
SEED_PRESETS = [("allgather", "small"), ("gemm_allgather", "small"), ("moe_dispatch_combine", "small"),
                ("attention_cp", "small"), ("kv_transfer", "small")]
CHUNK_CAP = "#define CUCO_SYMM_NCCL_CHUNK_BYTES (16 << 10)\n"
PREV = "prev = (me + W - 1) % W;"
HALF_COUNT = ("ncclAllGather(x->local, y->local, n,", "ncclAllGather(x->local, y->local, n / 2,")

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def _ops(uncapped: bool = False, wrong_peer: bool = False) -> str:
    code = (OPS / "host_nccl_ops.cu").read_text()
    assert CHUNK_CAP in code and PREV in code
    if uncapped:
        code = code.replace(CHUNK_CAP, "")
    if wrong_peer:  # receive from the next rank, which sends to the one after: at 4 ranks nobody's send is matched
        code = code.replace(PREV, "prev = (me + 1) % W;")
    return code


def _request(code: str, wl_dir: Path, preset: str, world: int, label: str, **kw) -> EvalRequest:
    wl = load_workload(wl_dir)
    fields = {"iters": 5, "warmup": 1, "trials": 3, "measure_seed": False, **kw}
    return EvalRequest(candidate_code=code, workload_dir=str(wl_dir), params=dict(wl.size_presets[preset]),
                       world_size=world, backend="symm", label=label, **fields)


def _wrong_count() -> str:
    code = (SAMPLES / "allgather" / "seed_nccl.cu").read_text()
    assert HALF_COUNT[0] in code
    return code.replace(*HALF_COUNT)


def _seed_requests(world: int) -> list[EvalRequest]:
    return [_request((SAMPLES / s / "seed_nccl.cu").read_text(), SAMPLES / s, p, world,
                     f"{s} seed_nccl.cu symm-{world}") for s, p in SEED_PRESETS]


@pytest.fixture(scope="module")
def built(evaluator) -> None:
    """Every build this file needs, timed and stress, in parallel before the first world starts."""
    reqs = [*_seed_requests(2), _request(_ops(), OPS, "small", 2, "ops"), _request(_ops(True), OPS, "large", 2, "big"),
            _request(_wrong_count(), SAMPLES / "allgather", "small", 2, "wrong count"),
            _request((OPS / "unjoined_gather.cu").read_text(), SAMPLES / "gemm_allgather", "small", 2, "unjoined"),
            _request(_ops(wrong_peer=True), OPS, "small", 4, "wrong peer")]
    with ThreadPoolExecutor(max_workers=8) as pool:
        ok = list(pool.map(evaluator.prebuild, reqs))
    assert all(ok), [r.label for r, good in zip(reqs, ok) if not good]


def _evaluate(evaluator, req: EvalRequest) -> EvalResult:
    """One evaluation in a fresh world, closed afterwards: at most one world (and its MPS clients) at a time."""
    try:
        return evaluator.evaluate(req)
    finally:
        evaluator.pool.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_sample_seed_nccl_passes_l2_under_symm_and_is_timed(evaluator, built, capsys, world: int) -> None:
    rows, failures = [], []
    for req in _seed_requests(world):  # the builds do not depend on the world size: built covers both
        r = _evaluate(evaluator, req)
        if r.verdict != "pass" or not r.median_ms:
            failures.append(f"{req.label}: {r.verdict} at {r.level_reached}: {r.reason[:300]}")
            continue
        rows.append(f"  {req.label:<48} median {r.median_ms:8.3f} ms ({r.timing['score'] if r.timing else '?'}), "
                    f"max rel err {r.max_rel_err:.2e}")
    with capsys.disabled():
        print("\nhost NCCL under symm, one GPU shared (no NVLink numbers):\n" + "\n".join(rows))
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 4])
def test_every_served_call_matches_torch(evaluator, built, world: int) -> None:
    r = _evaluate(evaluator, _request(_ops(), OPS, "small", world, f"host_nccl_ops symm-{world}"))
    assert r.verdict == "pass", f"{r.verdict} at {r.level_reached}: {r.reason}"
    assert r.max_rel_err is not None and r.max_rel_err < 1e-2, r.max_rel_err
    notes = r.provenance.get("notes", [])
    # the L2 trials ran on the stress build, whose flag waits pause (cuco_stress_configure was found)
    assert any(n.startswith("L2 trials ran on the stress build: one late rank") for n in notes), notes


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_messages_larger_than_the_staging_window(evaluator, built) -> None:
    r = _evaluate(evaluator, _request(_ops(uncapped=True), OPS, "large", 2, "host_nccl_ops large symm-2",
                                      iters=2, trials=2))
    assert r.verdict == "pass", f"{r.verdict} at {r.level_reached}: {r.reason}"


@pytest.mark.timeout(200)
def test_a_wrong_count_fails_l2_with_the_poison_it_left(evaluator, built) -> None:
    r = _evaluate(evaluator, _request(_wrong_count(), SAMPLES / "allgather", "small", 2, "wrong count"))
    assert r.verdict == "fail" and r.level_reached == "L2", f"{r.verdict} at {r.level_reached}: {r.reason}"
    assert "verification failed" in r.reason and "'y'" in r.reason, r.reason


@pytest.mark.timeout(200)
def test_a_gemm_not_waiting_for_its_side_stream_gather_fails_l2(evaluator, built) -> None:
    code = (OPS / "unjoined_gather.cu").read_text()
    r = _evaluate(evaluator, _request(code, SAMPLES / "gemm_allgather", "small", 2, "unjoined side stream"))
    assert r.verdict == "fail" and r.level_reached == "L2", f"{r.verdict} at {r.level_reached}: {r.reason}"
    assert "verification failed" in r.reason and "'y'" in r.reason, r.reason


@pytest.mark.serial
@pytest.mark.timeout(200)
def test_a_wrong_peer_hangs_like_nccl_and_fails_l2_on_the_watchdog(evaluator, built) -> None:
    # measure_seed: the seed's step time sets the watchdog (50x it, at least 2 s) instead of the 30 s default
    r = _evaluate(evaluator, _request(_ops(wrong_peer=True), OPS, "small", 4, "wrong peer", measure_seed=True))
    assert r.verdict == "fail" and r.level_reached == "L2", f"{r.verdict} at {r.level_reached}: {r.reason}"
    assert "timeout" in r.reason, r.reason
