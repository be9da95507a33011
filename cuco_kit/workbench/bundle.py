"""A run bundle: one file that carries a run anywhere, to be replayed with no GPU and no LLM.

A bundle is a zip holding
- `manifest.json`: {"format": "cuco-bundle", "version": 1, "created_at", "runs": [...], "files": {name: sha256}};
- `run.sqlite`: a consistent copy of the run's database (SQLite's backup, single file, no WAL), which holds the
  programs, proposals, decisions, evaluations with their timelines, and the LLM ledger;
- `provenance.json`: where and when each evaluation was measured (GPU, driver, CUDA, NCCL, git, date) and each
  build's provenance, readable without SQLite;
- `timelines/evaluation-<id>.json`: each recorded per-rank kernel timeline;
- `llm/<name>.jsonl`: LLM recordings (cuco_kit.llm.replay format) given when bundling.

Bundles are untrusted input: `open_bundle` refuses a member whose name is absolute, climbs out (`..`), is a link,
is not one the manifest lists, does not match its checksum, or would unpack to more than `MAX_UNPACKED_BYTES`; and
a manifest of another format or version, each with one line saying what to do.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import stat
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.store import Store

FORMAT = "cuco-bundle"
VERSION = 1
SUFFIX = ".cucobundle"
STORE_NAME = "run.sqlite"
MANIFEST = "manifest.json"
MAX_UNPACKED_BYTES = 2 << 30  # refuse zip bombs: a run's database is megabytes, not gigabytes
MAX_MEMBERS = 10_000
# Every name a bundle may hold: the manifest, the store, provenance, timelines and LLM recordings, flat.
_ALLOWED = re.compile(r"^(manifest\.json|run\.sqlite|provenance\.json|timelines/evaluation-\d+\.json|"
                      r"llm/[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.jsonl)$")
# Provenance keys kept per evaluation in provenance.json (the rest stays in the store).
PROVENANCE_KEYS = ("gpu", "gpus", "driver", "cuda", "cuda_driver", "nccl", "torch", "torch_cuda", "python", "mps",
                   "git", "date", "world", "backend", "symm_mem_backend", "build_seconds", "build_cached",
                   "eval_seconds", "simulated", "replayed_from")


class BundleError(BadInput):
    """A bundle that cannot be opened or written as asked; the message says what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _copy_store(src: Path, dst: Path) -> None:
    """A consistent single-file copy of a (possibly live, WAL) database."""
    uri = src.resolve().as_uri() + "?mode=ro"
    with sqlite3.connect(uri, uri=True) as a, sqlite3.connect(dst) as b:
        a.backup(b)
        b.execute("PRAGMA journal_mode = DELETE")
    a.close()
    b.close()


def _runs_summary(store: Store) -> list[dict[str, Any]]:
    out = []
    for r in store.runs():
        evs = store.evaluations(run_id=r["id"])
        provs = [e.get("provenance") or {} for e in evs]
        dates = sorted(str(p["date"])[:19] for p in provs if p.get("date"))
        best = store.best(r["id"])
        out.append({"id": r["id"], "workload": r["workload"], "badge": r["badge"], "state": r["state"],
                    "programs": len(store.programs(r["id"])), "evaluations": len(evs),
                    "gpus": sorted({str(p["gpu"]) for p in provs if p.get("gpu")}),
                    "drivers": sorted({str(p["driver"]) for p in provs if p.get("driver")}),
                    "first_date": dates[0] if dates else None, "last_date": dates[-1] if dates else None,
                    "world_sizes": sorted({int(e["world_size"]) for e in evs}),
                    "backends": sorted({str(e["backend"]) for e in evs}),
                    "best": None if best is None else {"program_id": best["program_id"], "name": best["name"],
                                                       "median_ms": best["median_ms"], "speedup": best["speedup"]}})
    return out


def write_bundle(store_path: str | Path, out: str | Path, *, llm_recordings: list[str | Path] | None = None) -> Path:
    """Bundle the database at `store_path` (and the LLM recordings given) into `out`; returns `out`."""
    src, dst = Path(store_path), Path(out)
    if not src.is_file():
        raise BundleError(f"no database at {src}; pass the .sqlite file of a run")
    recs = [Path(p) for p in llm_recordings or []]
    for p in recs:
        if not p.is_file():
            raise BundleError(f"no LLM recording at {p}; pass a .jsonl written by the recording client")
    names = [f"llm/{re.sub(r'[^A-Za-z0-9._-]', '_', p.stem)[:100] or 'recording'}.jsonl" for p in recs]
    if len(set(names)) != len(names):
        raise BundleError("two LLM recordings have the same name; rename one")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / STORE_NAME
        _copy_store(src, copy)
        files: dict[str, bytes] = {STORE_NAME: copy.read_bytes()}
        with Store(copy, readonly=True) as st:
            runs = _runs_summary(st)
            provenance, timelines = {}, {}
            for e in st.evaluations():
                prov = e.get("provenance") or {}
                provenance[str(e["id"])] = {"program_id": e["program_id"], "run_id": e["run_id"],
                                            "badge": e["badge"], **{k: prov[k] for k in PROVENANCE_KEYS if k in prov}}
                tl = (e.get("result") or {}).get("timeline")
                if tl:
                    timelines[f"timelines/evaluation-{e['id']}.json"] = json.dumps(
                        {"evaluation_id": e["id"], "badge": e["badge"], "events": tl}).encode()
        files["provenance.json"] = json.dumps(provenance, indent=1, sort_keys=True).encode()
        files.update(timelines)
        for name, p in zip(names, recs):
            files[name] = p.read_bytes()
    manifest = {"format": FORMAT, "version": VERSION, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "source": src.name, "runs": runs, "files": {n: _sha256(b) for n, b in sorted(files.items())}}
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = dst.with_name(dst.name + ".part")
    with zipfile.ZipFile(tmp_out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        for n, b in sorted(files.items()):
            z.writestr(n, b)
    tmp_out.replace(dst)
    return dst


@dataclass
class OpenedBundle:
    """A bundle unpacked into `directory`: its manifest, the store's path and the LLM recordings' paths."""

    path: Path
    directory: Path
    manifest: dict[str, Any]
    store_path: Path
    llm_recordings: list[Path] = field(default_factory=list)

    @property
    def runs(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("runs") or [])

    def main_run(self) -> dict[str, Any]:
        """The run with the most evaluations."""
        if not self.runs:
            raise BundleError(f"{self.path}: the bundle holds no run")
        return max(self.runs, key=lambda r: (r.get("evaluations") or 0, r.get("id") or 0))

    def measured(self, run: dict[str, Any] | None = None) -> str:
        """'NVIDIA H200, driver 580.1, 2026-12-02' (where and when), or what is missing."""
        r = run or self.main_run()
        parts = [", ".join(r.get("gpus") or []) or "GPU not recorded"]
        if r.get("drivers"):
            parts.append("driver " + ", ".join(r["drivers"]))
        first, last = (r.get("first_date") or "")[:10], (r.get("last_date") or "")[:10]
        parts.append((first if first == last else f"{first} to {last}") if first else "date not recorded")
        return ", ".join(parts)

    def open_store(self) -> Store:
        return Store(self.store_path, readonly=True)

    def summary(self) -> str:
        lines = [f"bundle {self.path.name} (format {self.manifest['format']} v{self.manifest['version']}, "
                 f"made {self.manifest.get('created_at', '?')} from {self.manifest.get('source', '?')})"]
        for r in self.runs:
            best = r.get("best")
            best_text = (f"best #{best['program_id']} {best['name']}: {best['median_ms']:.4f} ms"
                         + (f", {best['speedup']:.2f}x the seed" if best.get("speedup") else "")
                         if best and best.get("median_ms") is not None else "no passing program")
            lines.append(f"  run {r['id']}: {r['workload']}, {r['programs']} programs, {r['evaluations']} "
                         f"evaluations at {'/'.join(map(str, r['world_sizes']))} rank(s) "
                         f"{'/'.join(r['backends'])}; {best_text}")
            lines.append(f"    measured on {self.measured(r)} (badge here: replayed; stored as {r['badge']})")
        if self.llm_recordings:
            lines.append(f"  LLM recordings: {', '.join(p.name for p in self.llm_recordings)}")
        return "\n".join(lines)


def _check_member(info: zipfile.ZipInfo, listed: set[str] | None) -> None:
    name = info.filename
    pure = PurePosixPath(name)
    if "\\" in name or pure.is_absolute() or ".." in pure.parts or name.startswith("/") or ":" in name:
        raise BundleError(f"bundle member {name!r} points outside the bundle; refusing this bundle")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise BundleError(f"bundle member {name!r} is a link; refusing this bundle")
    if not _ALLOWED.match(name):
        raise BundleError(f"bundle member {name!r} is not part of the bundle format; refusing this bundle")
    if listed is not None and name not in listed:
        raise BundleError(f"bundle member {name!r} is not in its manifest; refusing this bundle")


def read_manifest(z: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(z.read(MANIFEST))
    except KeyError:
        raise BundleError(f"{path}: no {MANIFEST}; is it a cuco bundle? (make one with `cuco bundle RUN.sqlite`)") \
            from None
    except ValueError:
        raise BundleError(f"{path}: {MANIFEST} is not JSON; the bundle is damaged, make it again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        fmt = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"{path}: not a {FORMAT} (its manifest says format {fmt!r}); open a cuco bundle")
    if manifest.get("version") != VERSION:
        raise BundleError(f"{path}: bundle version {manifest.get('version')!r} is not supported (this cuco-kit "
                          f"reads version {VERSION}); open it with the cuco-kit that made it")
    if not isinstance(manifest.get("files"), dict) or STORE_NAME not in manifest["files"]:
        raise BundleError(f"{path}: the manifest lists no {STORE_NAME}; the bundle is damaged, make it again")
    return manifest


def open_bundle(path: str | Path, into: str | Path | None = None) -> OpenedBundle:
    """Check and unpack the bundle at `path` into `into` (a new temporary folder when None)."""
    p = Path(path)
    if not p.is_file():
        raise BundleError(f"no bundle at {p}; make one with `cuco bundle RUN.sqlite -o {p.name or 'run' + SUFFIX}`")
    try:
        z = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BundleError(f"{p} is not a bundle (not a zip file: {exc})") from None
    with z:
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise BundleError(f"{p}: {len(infos)} members, more than a bundle holds; refusing this bundle")
        for info in infos:  # names first: nothing is read from a bundle with a hostile name
            _check_member(info, None)
        if sum(i.file_size for i in infos) > MAX_UNPACKED_BYTES:
            raise BundleError(f"{p}: unpacks to more than {MAX_UNPACKED_BYTES >> 30} GiB; refusing this bundle")
        manifest = read_manifest(z, p)
        listed = set(manifest["files"]) | {MANIFEST}
        for info in infos:
            _check_member(info, listed)
        missing = set(manifest["files"]) - {i.filename for i in infos}
        if missing:
            raise BundleError(f"{p}: the manifest lists {sorted(missing)[0]!r} but the bundle lacks it; make it again")
        target = Path(into) if into is not None else Path(tempfile.mkdtemp(prefix="cuco-bundle-"))
        target.mkdir(parents=True, exist_ok=True)
        for info in infos:
            if info.filename == MANIFEST:
                continue
            data = z.read(info)
            if _sha256(data) != manifest["files"][info.filename]:
                raise BundleError(f"{p}: {info.filename} does not match its checksum; the bundle is damaged")
            out = target / info.filename
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
    store_path = target / STORE_NAME
    try:
        Store(store_path, readonly=True).close()
    except Exception as exc:  # noqa: BLE001 - a bundle's database is untrusted: any failure is one line
        shutil.rmtree(target, ignore_errors=True) if into is None else None
        raise BundleError(f"{p}: its database cannot be opened ({str(exc).splitlines()[0]})") from None
    recs = sorted((target / "llm").glob("*.jsonl")) if (target / "llm").is_dir() else []
    return OpenedBundle(p, target, manifest, store_path, recs)
