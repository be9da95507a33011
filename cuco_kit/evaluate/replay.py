"""The replay evaluator: serves REAL measurements recorded in a committed store, badged "replayed".

A request is matched by the candidate's code hash, world size, backend and workload parameters (resolved
against the workload's defaults when the workload can be loaded, so ``{}`` and the explicit defaults match).
Only evaluations that finished with badge "real" are served: a simulated number never comes back as a
measurement. A miss is verdict "unavailable" with reason "not in the replay database", never a made-up
number. The served result keeps the stored provenance (GPU, driver, NCCL, MPS, date) and adds where it was
replayed from.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Progress
from cuco_kit.evaluate.stats import speedup_ci
from cuco_kit.store import EvaluationRow, Store
from cuco_kit.workload import load_workload

MISS_REASON = "not in the replay database"


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


class ReplayEvaluator:
    badge = "replayed"

    def __init__(self, db_path: str | Path, *, accept_badges: tuple[str, ...] = ("real",)) -> None:
        p = Path(db_path)
        if not p.is_file():
            raise BadInput(f"replay database {p} does not exist; point the replay evaluator at a committed store "
                           "(e.g. benchmarks/search/<workload>.db)")
        self.db_path = str(p)
        self.accept_badges = accept_badges
        self._store = Store(p, readonly=True)
        self._lock = threading.Lock()
        self._workload_params: dict[str, dict[str, int] | None] = {}
        self.hits = 0
        self.misses = 0
        # (code hash, world, backend) -> [(stored request params, evaluation row)], newest last
        self._index: dict[tuple[str, int, str], list[tuple[dict, EvaluationRow]]] = {}
        for run in self._store.runs():
            programs = {p["id"]: p for p in self._store.programs(run["id"])}
            for ev in self._store.evaluations(run_id=run["id"]):
                if ev["status"] != "done" or ev.get("result") is None or ev["badge"] not in accept_badges:
                    continue
                prog = programs.get(ev["program_id"])
                if prog is None:
                    continue
                req = ev.get("request") or {}
                key = (prog["code_hash"], int(ev["world_size"]), str(ev["backend"]))
                self._index.setdefault(key, []).append((dict(req.get("params") or {}), ev))

    def __len__(self) -> int:
        return sum(len(v) for v in self._index.values())

    def _resolve(self, workload_dir: str, params: Mapping[str, int]) -> dict[str, int]:
        """Params with the workload's defaults filled in (as given when the workload cannot be loaded)."""
        if workload_dir not in self._workload_params:
            try:
                self._workload_params[workload_dir] = dict(load_workload(workload_dir).params)
            except Exception:  # noqa: BLE001 - a replay on a machine without the workload still matches raw
                self._workload_params[workload_dir] = None
        defaults = self._workload_params[workload_dir]
        out = dict(defaults or {})
        out.update({k: int(v) for k, v in params.items()})
        return out

    def lookup(self, request: EvalRequest) -> EvaluationRow | None:
        """The stored evaluation row that answers ``request`` (the newest match), or None."""
        key = (_code_hash(request.candidate_code), int(request.world_size), request.backend)
        want = self._resolve(request.workload_dir, request.params)
        for params, ev in reversed(self._index.get(key, [])):
            if self._resolve(request.workload_dir, params) == want:
                return ev
        return None

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        ev = self.lookup(request)
        with self._lock:
            if ev is None:
                self.misses += 1
            else:
                self.hits += 1
        if ev is None:
            return EvalResult("L0", "unavailable", reason=MISS_REASON, badge="replayed",
                              provenance={"replayed_from": self.db_path})
        d: dict[str, Any] = dict(ev["result"] or {})  # every indexed row has a result
        prov = dict(d.get("provenance") or {})
        prov.update(replayed_from=self.db_path, replayed_evaluation_id=ev["id"],
                    measured_badge=ev["badge"], measured_at=ev.get("finished_at"))
        d["provenance"] = prov
        d["badge"] = "replayed"
        known = set(EvalResult.__dataclass_fields__)
        if progress is not None:
            progress({"level": d.get("level_reached"), "step": "replayed"})
        res = EvalResult.from_dict({k: v for k, v in d.items() if k in known})
        if res.speedup_ci is None:  # recorded before intervals: from the iterations it carries, else absent
            res.speedup_ci = speedup_ci(res.seed_iteration_ms, res.iteration_ms, seed=request.seed)
        return res

    def describe(self) -> str:
        """One line for the badge: which GPUs and dates the database holds."""
        gpus, dates = set(), set()
        for rows in self._index.values():
            for _, ev in rows:
                prov = (ev.get("result") or {}).get("provenance") or {}
                if prov.get("gpu"):
                    gpus.add(str(prov["gpu"]))
                if prov.get("date"):
                    dates.add(str(prov["date"])[:10])
        return (f"replayed: {', '.join(sorted(gpus)) or 'unknown GPU'}, "
                f"{', '.join(sorted(dates)) or 'unknown date'} ({len(self)} measurements from {self.db_path})")

    def close(self) -> None:
        self._store.close()
