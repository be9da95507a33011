"""The recordings folder's MANIFEST.json: what each file the notebooks replay is, and which script wrote it.

The folder (the repository's ``recordings/``, or ``$CUCO_RECORDINGS``) holds the data the notebooks replay without a
GPU: search stores (the replay evaluator's answers and the recorded runs the dashboards open), benchmark JSON the
teaching notebook tabulates, and measured kernel timelines. The recording scripts write the files there and call
``record`` for each, so the manifest says, per file, its kind, workload, configurations, GPU and date; readers ask
``listed`` for a kind instead of globbing, and a file the manifest does not list is not shown as a measurement.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from cuco_kit.errors import BadInput
from cuco_kit.store import Store

MANIFEST = "MANIFEST.json"
# search: a store of a real search or of recorded configurations (replayed); benchmark: a sample benchmark's
# results JSON (tabulated); timeline: a measured per-rank kernel timeline (drawn).
Kind = Literal["search", "benchmark", "timeline"]
KINDS: tuple[Kind, ...] = ("search", "benchmark", "timeline")
VERSION = 1


def read_manifest(folder: str | Path) -> list[dict[str, Any]]:
    """The manifest's entries (each with "file", relative to ``folder``, and "kind"); [] when there is none."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not readable JSON ({exc}); fix it or record again") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e and "kind" in e
                                                for e in entries):
        raise BadInput(f"{path}: needs {{\"entries\": [{{\"file\": ..., \"kind\": ...}}, ...]}}; record again")
    return entries


def listed(folder: str | Path, kind: Kind, workload: str | None = None) -> list[Path]:
    """The files of ``kind`` (of ``workload`` when given) the manifest lists and the folder has, by name."""
    base = Path(folder)
    return sorted(base / e["file"] for e in read_manifest(base)
                  if e["kind"] == kind and (workload is None or e.get("workload") == workload)
                  and (base / e["file"]).is_file())


def describe_store(path: str | Path) -> dict[str, Any]:
    """A store's manifest fields: its workload, the (backend, ranks) it evaluated at, how many evaluations, and
    the GPU and date of the first evaluation that names them."""
    with Store(path, readonly=True) as st:
        workloads = sorted({str(r.get("workload") or "") for r in st.runs()} - {""})
        evs = st.evaluations()
    configs = sorted({f"{e['backend']}-{e['world_size']}" for e in evs if e.get("backend")})
    prov = next((e.get("provenance") or {} for e in evs if (e.get("provenance") or {}).get("gpu")), {})
    return {"workload": workloads[0] if len(workloads) == 1 else workloads, "configs": configs,
            "evaluations": len(evs), "gpu": str(prov.get("gpu") or ""), "date": str(prov.get("date") or "")[:10]}


def describe_json(path: str | Path) -> dict[str, Any]:
    """A benchmark or timeline JSON's manifest fields: its GPU and date, from its top level or its "meta"."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        return {"gpu": "", "date": ""}
    meta = data.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    runs = meta.get("runs")
    first = runs[0] if isinstance(runs, list) and runs and isinstance(runs[0], dict) else {}

    def pick(key: str) -> str:  # the file's own value, else its meta's, else its first merged run's
        return str(data.get(key) or meta.get(key) or first.get(key) or "")

    return {"gpu": pick("gpu"), "date": pick("date")[:10]}


def record(folder: str | Path, file: str | Path, kind: Kind, *, written_by: str, workload: str | None = None,
           **fields: Any) -> dict[str, Any]:
    """Add or replace ``file``'s entry (a path inside ``folder``) and rewrite the manifest, entries by file name.
    The entry is described from the file itself (describe_store / describe_json) plus ``fields``."""
    if kind not in KINDS:
        raise BadInput(f"recording kind {kind!r}: use one of {', '.join(KINDS)}")
    base = Path(folder)
    path = Path(file) if Path(file).is_absolute() else base / file
    rel = path.resolve().relative_to(base.resolve()).as_posix()
    entry: dict[str, Any] = {"file": rel, "kind": kind}
    entry.update(describe_store(path) if kind == "search" else describe_json(path))
    if workload is not None:
        entry["workload"] = workload
    entry.update(fields, written_by=written_by)
    entries = [e for e in read_manifest(base) if e["file"] != rel] + [entry]
    entries.sort(key=lambda e: e["file"])
    (base / MANIFEST).write_text(json.dumps({"version": VERSION, "entries": entries}, indent=1) + "\n",
                                 encoding="utf-8")
    return entry
