"""GPU tier: a short LLM-mutated search on the MoE sample (the largest file) with scripted block-wise answers.

The answers are LABELLED FIXTURES served in process by ScriptedClient (no server, no openai package: the GPU image
has none): two rewrites that send EVOLVE blocks only, with prose around, and one SEARCH/REPLACE edit. The search
runs at 2 ranks under `symm` on the small preset; every LLM program must keep the baseline's frozen bytes, and at
least one must pass verification and be timed. With $OUT set, a JSON summary is written there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cuco_kit.evaluate.device import MULTICAST_OFF, gpu_present
from cuco_kit.llm.fake_server import answer
from cuco_kit.llm.scripted import ScriptedClient
from cuco_kit.search.budget import BudgetConfig
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.engine import SearchEngine
from cuco_kit.search.llm_source import LLMSource
from cuco_kit.source import markers
from cuco_kit.store import Store
from cuco_kit.workload import load_workload

os.environ.update(MULTICAST_OFF)  # every process of this test, ranks included, keeps NVLink multicast off
MOE = Path(__file__).resolve().parents[2] / "sample_kernels" / "moe_dispatch_combine"

pytestmark = pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU (nvidia-smi)")


def _block(code: str, name: str, **subs: str) -> str:
    text = next(b for b in markers.blocks(code) if b.name == name).text
    for old, new in subs.items():
        assert old in text, old
        text = text.replace(old, new)
    return f"// EVOLVE-BLOCK-START {name}\n{text}// EVOLVE-BLOCK-END"


def _script(base: str) -> list:
    head = "NAME: {}\nRATIONALE: scripted fixture for the GPU tier.\nTAGS: fixture\n\n"
    deeper = _block(base, "tuning", **{"kLoadBatch = 4;": "kLoadBatch = 8;"})
    chunks = _block(base, "knobs", **{"kChunkRows = 8;": "kChunkRows = 16;"})
    combine = _block(base, "tuning", **{"kCombineThreads = 256;": "kCombineThreads = 512;"})
    edit = ("<<<<<<< SEARCH\nconstexpr int kPutBlocks = 32;  // knob: {8, 16, 32, 64}\n=======\n"
            "constexpr int kPutBlocks = 64;  // knob: {8, 16, 32, 64}\n>>>>>>> REPLACE\n")
    return [
        answer("deeper", head.format("deeper load batch") + f"Only the tuning block:\n```cuda\n{deeper}\n```\nDone.\n"),
        answer("chunks", head.format("bigger chunks, wider combine") + f"```cuda\n{chunks}\n```\n\nand\n\n"
                                                                      f"```cuda\n{combine}\n```\n"),
        answer("edit", head.format("more push CTAs") + edit),
        answer("again", head.format("deeper load batch") + f"```cuda\n{deeper}\n```\n", times=0),
    ]


def test_llm_search_on_moe_keeps_frozen_bytes_and_times_candidates(evaluator, tmp_path: Path) -> None:
    wl = load_workload(MOE)
    base = wl.path(wl.baseline).read_text()
    cfg = SearchConfig(world_size=2, backend="symm", params=dict(wl.size_presets["small"]), iters=5,
                       proposals_per_generation=2, budget=BudgetConfig(generations=2, llm_dollars=1.0))
    cfg.meta.interval = 0
    cfg.phases.mode = "fixed"
    for s in (cfg.phases.explore, cfg.phases.exploit):
        s.mix = {"full": 2.0, "diff": 1.0}
    client = ScriptedClient(_script(base), model="fixture")
    store = Store(tmp_path / "llm_gpu.db")
    eng = SearchEngine(MOE, store, evaluator, [LLMSource(client)], cfg)
    summary = eng.run()
    rid = eng.run_id
    evs = {e["program_id"]: e for e in store.evaluations(run_id=rid)}
    progs = [p for p in store.programs(rid) if p["source"].startswith("llm")]
    rows = [{"id": p["id"], "name": p["name"], "source": p["source"],
             "frozen_intact": markers.frozen_hash(p["code"]) == markers.frozen_hash(base),
             **{k: (evs.get(p["id"]) or {}).get(k) for k in ("level_reached", "verdict", "median_ms", "speedup",
                                                              "reason")}} for p in progs]
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "llm_search_gpu.json").write_text(json.dumps(
            {"summary": summary.to_dict(), "programs": rows, "llm_calls": len(store.llm_calls(rid))}, indent=2))
    assert len(progs) >= 2, rows
    assert all(r["frozen_intact"] for r in rows), rows
    assert all("fixture" in p["tags"] for p in progs)
    timed = [r for r in rows if r["verdict"] == "pass" and r["median_ms"]]
    assert timed, rows
