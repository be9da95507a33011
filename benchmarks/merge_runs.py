"""Merge several GPU runs of one sample's benchmark into its results JSON and benchmarks/<sample>/RESULTS.md.

  python3 benchmarks/merge_runs.py SAMPLE RUN.json[=NOTE] [RUN.json[=NOTE] ...]

One time-limited run on a GPU machine rarely holds a whole sample, so the rows come from several runs. Later runs
supersede earlier rows of the same (phase, name, world, preset): the superseded rows stay in the JSON under
"superseded", with the note of the run that replaced them, and the table lists them, so a failure fixed later is
never silently dropped. The table is the sample's own `make_table`. A RUN.json may itself be an earlier merge (a
sample's results JSON, copied aside first since it is rewritten): its runs, notes and superseded rows carry over.

The results JSON is benchmarks/<sample>/results.json, or, for a sample whose results the notebooks replay (the
recordings' MANIFEST.json lists recordings/<sample>-results.json as a benchmark), that recording, whose manifest
entry is then written again.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Run by path, not installed: benchmarks/ (what the sample scripts import) and the repository root (the kit) go first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuco_kit.evaluate.manifest import listed, record
from cuco_kit.workload import load_workload

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE.parent / "recordings"


def results_path(sample: str, recordings: Path = RECORDINGS) -> Path:
    """Where a sample's merged results go: its recording when the manifest lists one, else beside its script."""
    replayed = [p for p in listed(recordings, "benchmark", sample) if p.name == f"{sample}-results.json"]
    return replayed[0] if replayed else HERE / sample / "results.json"


def key(row: dict[str, Any]) -> tuple:
    return row["phase"], row["name"], row["world"], row["preset"]


def owns(result: dict[str, Any], ref_key: str) -> bool:
    """Whether a run's reference timing `ref_key` goes with rows of that run: a reference belongs beside the rows
    it was measured with ("8192-W4" with the 8192 rows at world size 4; a preset name with any benchmark row)."""
    m = re.fullmatch(r"(.+)-W(\d+)", ref_key)
    bench = [r for r in result["rows"] if r["phase"] != "L2"]
    if m:
        return any(r["preset"] == m.group(1) and r["world"] == int(m.group(2)) for r in bench)
    return bool(bench)


def load_script(sample: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{sample}", HERE / sample / "run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def merge(runs: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
    rows: dict[tuple, dict[str, Any]] = {}
    superseded: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    metas = []
    for result, note in runs:
        merged_before = "runs" in result["meta"]  # an earlier merge (results.json): keep its runs and notes
        if merged_before:
            metas.extend(result["meta"]["runs"])
            superseded.extend(result.get("superseded", []))
        else:
            metas.append({**result["meta"], "note": note})
        for name, value in result.items():
            if name in ("meta", "rows", "superseded"):
                continue
            if isinstance(value, dict):
                extra.setdefault(name, {}).update({k: v for k, v in value.items() if owns(result, k)})
            elif isinstance(value, list):  # e.g. the evaluator's warm/cold history: every run's, in order
                extra.setdefault(name, []).extend(value)
        for row in result["rows"]:
            row = row if merged_before else {**row, "run": note}
            old = rows.get(key(row))
            if old is not None:
                superseded.append({**old, "superseded_by": note})
            rows[key(row)] = row
    meta = {**metas[-1], "skipped": [s for m in metas for s in m.get("skipped", [])], "runs": metas}
    meta.pop("note", None)
    for name in ("gpu", "driver", "nccl", "torch", "mps"):  # a run without nccl (or symm) rows leaves these None
        meta[name] = next((m[name] for m in reversed(metas) if m.get(name) is not None), None)
    # a row skipped (budget) in one run but measured in another is not skipped
    done = {f"{r['phase']} {r['name']} {r['backend']}-{r['world']} {r['preset']}" for r in rows.values()}
    meta["skipped"] = [s for s in meta["skipped"] if s not in done]
    return {"meta": meta, **extra, "rows": list(rows.values()), "superseded": superseded}


def table(sample: str, merged: dict[str, Any]) -> str:
    mod = load_script(sample)
    refs = next((v for k, v in merged.items() if isinstance(v, dict) and k != "meta"), {})
    bench = SimpleNamespace(rows=merged["rows"], meta=lambda: merged["meta"], skipped=merged["meta"]["skipped"],
                            worlds=sorted({r["world"] for r in merged["rows"]}),
                            wl=load_workload(HERE.parent / "sample_kernels" / sample))
    text = mod.make_table(bench, refs)
    lines = [text.rstrip("\n"), "", "## Runs", ""]
    lines += [f"- {m['date']}: {m['note']}" for m in merged["meta"]["runs"]]
    if merged["superseded"]:
        lines += ["", "## Superseded rows (kept in results.json)", ""]
        lines += [f"- {r['phase']} {r['name']} {r['backend']}-{r['world']} {r['preset']}: {r['verdict']} "
                  f"({r['reason'][:120] or 'ok'}); re-run in: {r['superseded_by']}" for r in merged["superseded"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    sample, specs = argv[0], argv[1:]
    runs = []
    for spec in specs:
        path, _, note = spec.partition("=")
        try:
            runs.append((json.loads(Path(path).read_text()), note or path))
        except (OSError, ValueError) as exc:
            print(f"merge_runs: cannot read {path}: {exc}")
            return 2
    merged = merge(runs)
    out, results = HERE / sample, results_path(sample)
    results.write_text(json.dumps(merged, indent=1, default=str))
    if results.parent == RECORDINGS:
        record(RECORDINGS, results.name, "benchmark", workload=sample, written_by="benchmarks/merge_runs.py")
    (out / "RESULTS.md").write_text(table(sample, merged))
    print(f"wrote {results} ({len(merged['rows'])} rows, {len(merged['superseded'])} superseded) "
          f"and {out / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
