"""The replay evaluator: serves REAL measurements recorded in a committed store, badged "replayed".

A request is matched by the candidate's code hash, world size, backend and workload parameters (resolved
against the workload's defaults when the workload can be loaded, so ``{}`` and the explicit defaults match).
One evaluator can serve several stores (every recording of a folder). Only evaluations that finished with
badge "real" are served: a simulated number never comes back as a measurement. A miss is verdict
"unavailable" with a reason that starts "not in the replay database" and says which nearby configurations
are recorded (`cuco_kit.evaluate.recordings`), never a made-up number. The served result keeps the stored
provenance (GPU, driver, NCCL, MPS, date) and adds which recording it was replayed from.
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.api import EvalRequest, EvalResult, Progress
from cuco_kit.evaluate.recordings import RecordedConfig, catalogue, miss_hint
from cuco_kit.evaluate.stats import speedup_ci
from cuco_kit.store import EvaluationRow, Store
from cuco_kit.workload import load_workload

MISS_REASON = "not in the replay database"


def _code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


class ReplayEvaluator:
    badge = "replayed"

    def __init__(self, db_path: str | Path | Sequence[str | Path], *,
                 accept_badges: tuple[str, ...] = ("real",)) -> None:
        paths = [Path(db_path)] if isinstance(db_path, (str, Path)) else [Path(p) for p in db_path]
        if not paths:
            raise BadInput("the replay evaluator needs at least one recording (a store of a real run)")
        for p in paths:
            if not p.is_file():
                raise BadInput(f"replay database {p} does not exist; point the replay evaluator at a recording "
                               "(e.g. recordings/<workload>-*.sqlite)")
        self.paths = [str(p) for p in paths]
        self.db_path = self.paths[0] if len(paths) == 1 else f"{len(paths)} recordings in {paths[0].parent}"
        self.accept_badges = accept_badges
        self._stores = [Store(p, readonly=True) for p in paths]
        self._lock = threading.Lock()
        self._workload_params: dict[str, dict[str, int] | None] = {}
        self._configs: dict[str, list[RecordedConfig]] = {}
        self.hits = 0
        self.misses = 0
        # (code hash, world, backend) -> [(stored request params, evaluation row, its store)], newest last
        self._index: dict[tuple[str, int, str], list[tuple[dict[str, Any], EvaluationRow, str]]] = {}
        for path, store in zip(self.paths, self._stores):
            for run in store.runs():
                programs = {p["id"]: p for p in store.programs(run["id"])}
                for ev in store.evaluations(run_id=run["id"]):
                    if ev["status"] != "done" or ev.get("result") is None or ev["badge"] not in accept_badges:
                        continue
                    prog = programs.get(ev["program_id"])
                    if prog is None:
                        continue
                    req = ev.get("request") or {}
                    key = (prog["code_hash"], int(ev["world_size"]), str(ev["backend"]))
                    self._index.setdefault(key, []).append((dict(req.get("params") or {}), ev, path))

    def __len__(self) -> int:
        return sum(len(v) for v in self._index.values())

    def _defaults(self, workload_dir: str) -> dict[str, int] | None:
        if workload_dir not in self._workload_params:
            try:
                self._workload_params[workload_dir] = dict(load_workload(workload_dir).params)
            except Exception:  # noqa: BLE001 - a replay on a machine without the workload still matches raw
                self._workload_params[workload_dir] = None
        return self._workload_params[workload_dir]

    def _resolve(self, workload_dir: str, params: Mapping[str, int]) -> dict[str, int]:
        """Params with the workload's defaults filled in (as given when the workload cannot be loaded)."""
        out = dict(self._defaults(workload_dir) or {})
        out.update({k: int(v) for k, v in params.items()})
        return out

    def configs(self, workload_dir: str | Path) -> list[RecordedConfig]:
        """The configurations of this workload that the recordings answer, most evaluations first."""
        key = str(workload_dir)
        if key not in self._configs:
            name = Path(key.rstrip("/")).name
            defaults = self._defaults(key)
            every = catalogue(self.paths, {name: defaults} if defaults else None, badges=self.accept_badges)
            self._configs[key] = [c for c in every if c.workload == name]
        return self._configs[key]

    def miss_reason(self, request: EvalRequest) -> str:
        """'not in the replay database: <what is and is not recorded nearby>'."""
        name = Path(str(request.workload_dir).rstrip("/")).name
        hint = miss_hint(self.configs(request.workload_dir), name, int(request.world_size), request.backend,
                         self._resolve(request.workload_dir, request.params))
        return f"{MISS_REASON}: {hint}"

    def _match(self, request: EvalRequest) -> tuple[EvaluationRow, str] | None:
        key = (_code_hash(request.candidate_code), int(request.world_size), request.backend)
        want = self._resolve(request.workload_dir, request.params)
        for params, ev, path in reversed(self._index.get(key, [])):
            if self._resolve(request.workload_dir, params) == want:
                return ev, path
        return None

    def lookup(self, request: EvalRequest) -> EvaluationRow | None:
        """The stored evaluation row that answers ``request`` (the newest match), or None."""
        found = self._match(request)
        return None if found is None else found[0]

    def evaluate(self, request: EvalRequest, progress: Progress | None = None) -> EvalResult:
        found = self._match(request)
        with self._lock:
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
        if found is None:
            return EvalResult("L0", "unavailable", reason=self.miss_reason(request), badge="replayed",
                              provenance={"replayed_from": self.db_path})
        ev, path = found
        d: dict[str, Any] = dict(ev["result"] or {})  # every indexed row has a result
        prov = dict(d.get("provenance") or {})
        prov.update(replayed_from=path, replayed_evaluation_id=ev["id"],
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
            for _, ev, _ in rows:
                prov = (ev.get("result") or {}).get("provenance") or {}
                if prov.get("gpu"):
                    gpus.add(str(prov["gpu"]))
                if prov.get("date"):
                    dates.add(str(prov["date"])[:10])
        return (f"replayed: {', '.join(sorted(gpus)) or 'unknown GPU'}, "
                f"{', '.join(sorted(dates)) or 'unknown date'} ({len(self)} measurements from {self.db_path})")

    def close(self) -> None:
        for store in self._stores:
            store.close()
