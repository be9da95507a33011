"""The teaching notebook's material: the overlap model (formulas, not measurements), the workload's own counts,
and the measured benchmark JSON and kernel timelines the recordings folder's MANIFEST.json lists
(`workbench.recordings_dir()`: the repository's recordings/), so these readers need a checkout, not only an
installed kit.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.evaluate.manifest import Kind, listed
from cuco_kit.workbench import recordings_dir
from cuco_kit.workload import load_workload


def overlap_bound(compute_ms: float, comm_ms: float, chunks: int = 1) -> dict[str, float]:
    """Formula, not a measurement. Sequential: compute + comm. With the transfer cut into `chunks` pieces and
    each piece's compute starting when it lands, the pipeline takes about max(c, m) + min(c, m) / chunks (the
    first piece cannot overlap anything). Perfect overlap is max(c, m), so the speed-up over sequential is at
    most (c + m) / max(c, m) <= 2."""
    if compute_ms < 0 or comm_ms < 0 or chunks < 1:
        raise BadInput("overlap_bound needs compute_ms >= 0, comm_ms >= 0 and chunks >= 1")
    seq = compute_ms + comm_ms
    hi, lo = max(compute_ms, comm_ms), min(compute_ms, comm_ms)
    piped = hi + lo / chunks
    return {"sequential_ms": seq, "pipelined_ms": piped, "perfect_overlap_ms": hi,
            "speedup_pipelined": seq / piped if piped else 1.0, "speedup_bound": seq / hi if hi else 1.0}


def model_schedule(compute: float, comm: float, chunks: int, ranks: int = 1) -> list[dict[str, Any]]:
    """Events {rank, stream, name, start_us, dur_us} of the MODEL behind `overlap_bound` (arbitrary time units):
    the transfer in `chunks` pieces on one stream, each piece's compute on another once it has landed. For
    drawing with TimelineView under a "model" badge; not a measurement."""
    if chunks < 1:
        raise BadInput("chunks must be >= 1")
    out: list[dict[str, Any]] = []
    c, m = compute / chunks, comm / chunks
    for r in range(ranks):
        comp_free = 0.0
        for i in range(chunks):
            landed = (i + 1) * m
            out.append({"rank": r, "stream": 1, "name": "transfer", "start_us": i * m, "dur_us": m})
            start = max(landed, comp_free)
            out.append({"rank": r, "stream": 0, "name": "compute", "start_us": start, "dur_us": c})
            comp_free = start + c
    return out


def workload_counts(workload_dir: str | Path, params: dict[str, int] | None = None,
                    worlds: Iterable[int] = (1, 2, 4, 8)) -> Any:
    """The workload's own flop and byte counts per rank (formulas in its workload.py, not measurements): a
    pandas frame with world, flops, bytes received and flops per byte received."""
    import pandas as pd

    wl = load_workload(workload_dir)
    p = wl.resolve(params)
    if wl.flops is None or wl.comm_bytes is None:
        raise BadInput(f"workload {wl.name} does not declare flops/comm_bytes")
    rows = []
    for w in worlds:
        try:
            f, b = wl.flops(p, w), wl.comm_bytes(p, w)
        except BadInput:
            continue  # sizes that do not split over w ranks
        rows.append({"world": w, "GFLOP per rank": f / 1e9, "MB received per rank": b / 1e6,
                     "flops per byte received": (f / b) if b else float("inf")})
    return pd.DataFrame(rows)


def load_benchmarks(workload: str | None = "gemm_allgather", kind: Kind = "benchmark") -> list[tuple[Path, Any]]:
    """Every recorded JSON of `kind` of `workload` (None: any workload) the manifest lists, parsed; [] when
    none."""
    return _load(listed(recordings_dir(), kind, workload))


def _load(paths: Iterable[Path]) -> list[tuple[Path, Any]]:
    out = []
    for p in paths:
        try:
            out.append((p, json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            raise BadInput(f"{p}: not readable JSON ({exc}); fix or remove the file") from None
    return out


def benchmark_frame(items: list[tuple[Path, Any]]) -> Any:
    """One pandas row per measured record, whatever list the JSON keeps them in ("results", "rows",
    "records", "points" or a top-level list); top-level scalars (gpu, date, nccl ...) are copied onto each row."""
    import pandas as pd

    frames = []
    for path, data in items:
        rows: Any = data
        top: dict[str, Any] = {}
        if isinstance(data, dict):
            top = {k: v for k, v in data.items() if not isinstance(v, (list, dict))}
            for key in ("results", "rows", "records", "points", "measurements"):
                if isinstance(data.get(key), list):
                    rows = data[key]
                    break
            else:
                rows = [data]
        if not isinstance(rows, list):
            continue
        df = pd.json_normalize([r for r in rows if isinstance(r, dict)])
        for k, v in top.items():
            if k not in df.columns:
                df[k] = v
        df["file"] = path.name
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def recorded_timelines(workload: str | None = None) -> list[dict[str, Any]]:
    """Recorded measured kernel timelines (the manifest's "timeline" entries, of `workload` when given): dicts with
    "events" ({rank, stream, name, start_us, dur_us}) and, when recorded, "badge" and "detail" (GPU, date). []
    when none is recorded."""
    out = []
    for path, data in _load(listed(recordings_dir(), "timeline", workload)):
        if isinstance(data, list):
            data = {"events": data}
        if isinstance(data, dict) and isinstance(data.get("events"), list):
            detail = data.get("detail") or ", ".join(str(data[k]) for k in ("gpu", "date") if data.get(k))
            out.append({"events": data["events"], "badge": data.get("badge", "real"), "detail": detail,
                        "path": path})
    return out
