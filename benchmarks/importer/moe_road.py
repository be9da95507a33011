"""The user's road on the CUCo reference's own MoE seed, on a GPU: `cuco init` on the public program (not in this
repository: pass the folder that holds it), then, at 2 `symm` ranks on one GPU (the program runs on exactly 2):

  1. the imported seed against itself, the workload having no reference yet (oracle: the seed);
  2. a device-initiated rewrite of its two all-to-alls (LSA push kernels; written by a person on this project as
     a fast-path Stage B edit, kept beside the program) against the seed as the oracle, with no torch reference;
  3. the same rewrite with the push written at the wrong offset, which must fail against the seed;
  4. a torch reference approved (written by a person on this project from reading the program), then the seed
     and the rewrite against it.

Ranks sharing one GPU check correctness and contention, never NVLink speed: the times printed say nothing of a
2-GPU machine. Writes <out>/moe_road.json (every result, GPU, driver, NCCL, git revision, date) and prints a table.

    python benchmarks/importer/moe_road.py --programs DIR --out OUT
DIR holds ds_v3_moe.cu (UT-InfraAI/cuco workloads/ds_v3_moe), ds_v3_moe_lsa.cu and ds_v3_moe_reference.py.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuco_kit.evaluate.api import EvalRequest, EvalResult, checked_against
from cuco_kit.evaluate.device import detect_gpu, git_revision
from cuco_kit.evaluate.gpu_evaluator import GpuEvaluator
from cuco_kit.importer.session import ImportSession
from cuco_kit.workload import load_workload

RIGHT_OFFSET = "ncclGetLsaPointer(dst, (size_t)me * chunkVecs"
WRONG_OFFSET = "ncclGetLsaPointer(dst, (size_t)peer * chunkVecs"
REFERENCE_BLOCK = re.compile(r"# --- reference:[^\n]*\n(.*?)(?:# --- end of reference ---|\Z)", re.DOTALL)


def _row(step: str, res: EvalResult, expect: str) -> dict:
    return {"step": step, "expect": expect, "verdict": res.verdict, "level": res.level_reached,
            "oracle": res.oracle, "checked": checked_against(res.oracle), "reason": res.reason[:300],
            "median_ms": res.median_ms, "seed_median_ms": res.seed_median_ms, "max_rel_err": res.max_rel_err,
            "ok": res.verdict == expect, "provenance": {k: res.provenance.get(k) for k in
                                                        ("gpu", "driver", "nccl", "mps", "world", "backend")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="moe-road-")) / "ds_v3_moe"
    session = ImportSession(args.programs / "ds_v3_moe.cu", d)
    session.write()
    lsa = (args.programs / "ds_v3_moe_lsa.cu").read_text()
    assert RIGHT_OFFSET in lsa, "the rewrite no longer has the push offset this script breaks"
    seed = (d / "seed_nccl.cu").read_text()
    ev = GpuEvaluator()
    rows: list[dict] = []

    def run(step: str, code: str, expect: str) -> None:
        wl = load_workload(d)
        res = ev.evaluate(EvalRequest(candidate_code=code, workload_dir=str(d), params=dict(wl.size_presets["small"]),
                                      world_size=2, backend="symm", iters=args.iters, trials=3, measure_seed=True,
                                      label=step))
        rows.append(_row(step, res, expect))
        r = rows[-1]
        print(f"{'ok ' if r['ok'] else 'BAD'} {step:58s} {r['verdict']:5s} at {r['level']} ({r['checked']}) "
              f"median {r['median_ms']} ms, seed {r['seed_median_ms']} ms, max rel err {r['max_rel_err']}"
              + (f" - {r['reason'][:160]}" if r["verdict"] != "pass" else ""), flush=True)

    try:
        assert load_workload(d).oracle == "seed"
        run("1. imported seed, no reference (seed as oracle)", seed, "pass")
        run("2. LSA rewrite vs the seed as oracle", lsa, "pass")
        run("3. LSA rewrite, push at the wrong offset, vs the seed", lsa.replace(RIGHT_OFFSET, WRONG_OFFSET), "fail")
        ref = REFERENCE_BLOCK.search((args.programs / "ds_v3_moe_reference.py").read_text())
        assert ref is not None, "ds_v3_moe_reference.py has no reference block"
        session.accept_reference(ref.group(1))
        assert load_workload(d).oracle == "reference"
        run("4a. imported seed vs the approved torch reference", seed, "pass")
        run("4b. LSA rewrite vs the approved torch reference", lsa, "pass")
    finally:
        ev.close()
    gpus = detect_gpu()
    out = {"rows": rows, "gpu": gpus[0] if gpus else None, "git": git_revision(),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "note": "2 symm ranks sharing one GPU under MPS: correctness and contention, not NVLink speed"}
    (args.out / "moe_road.json").write_text(json.dumps(out, indent=1, default=str))
    bad = [r["step"] for r in rows if not r["ok"]]
    print(f"moe road: {len(rows) - len(bad)} of {len(rows)} as expected" + (f"; unexpected: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
