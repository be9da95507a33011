"""Quick nccl world-1 diagnosis on a GPU machine: evaluate a few candidates and print their rank logs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cuco_kit.evaluate.api import EvalRequest  # noqa: E402
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ev = GpuEvaluator()
cases = [("sample_kernels/allgather", "sample_kernels/allgather/device_lsa.cu", {}),
         ("sample_kernels/gemm_allgather", "sample_kernels/gemm_allgather/device_lsa.cu", {"M": 4096, "N": 4096, "K": 4096}),
         ("sample_kernels/gemm_allgather", "benchmarks/gemm_allgather/cublas_alone.cu", {"M": 4096, "N": 4096, "K": 4096})]
for wl, f, params in cases:
    r = ev.evaluate(EvalRequest(candidate_code=(ROOT / f).read_text(), workload_dir=str(ROOT / wl), params=params,
                                world_size=1, backend="nccl", iters=20, label=f))
    print(f"== {f}: {r.verdict} {r.level_reached} median {r.median_ms} seed {r.seed_median_ms} x{r.speedup} {r.reason[:200]}")
    if r.verdict != "pass":
        for k, v in r.logs.items():
            if k != "build":
                print(f"-- {k}:\n{v[-1500:]}")
ev.close()
