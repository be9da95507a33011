"""Run bundles: written from a run, opened read-only with its provenance and timelines; hostile bundles refused
with one line."""
from __future__ import annotations

import json
import zipfile

import pytest

from cuco_kit import cli
from cuco_kit.evaluate.api import EvalResult
from cuco_kit.store import Store
from cuco_kit.widgets import BundlePanel
from cuco_kit.workbench.bundle import MANIFEST, BundleError, open_bundle, write_bundle

pytestmark = pytest.mark.unit

PROV = {"gpu": "NVIDIA H200", "driver": "580.159.04", "date": "2026-12-03T15:58:01+00:00", "eval_seconds": 1.5}
TIMELINE = [{"rank": 0, "iteration": 0, "stream": 7, "name": "gemm", "start_us": 0.0, "dur_us": 10.0},
            {"rank": 0, "iteration": 0, "stream": 9, "name": "ncclDevKernel", "start_us": 5.0, "dur_us": 10.0}]


@pytest.fixture()
def run_db(tmp_path):
    path = tmp_path / "run.sqlite"
    st = Store(path)
    rid = st.create_run(workload="gemm_allgather", config={}, seed=0)
    seed = st.add_program(run_id=rid, code="int s;\n", parent_id=None, source="seed", name="seed")
    eid = st.start_evaluation(seed, world_size=2, backend="symm", badge="real", request={})
    st.finish_evaluation(eid, EvalResult("L3", "pass", median_ms=0.5, speedup=1.0, provenance=PROV,
                                         timeline=TIMELINE).to_dict())
    st.close()  # left in WAL: the bundle must copy it consistently
    rec = tmp_path / "answers.jsonl"
    rec.write_text('{"v": 1}\n')
    return path, rec


def test_bundle_round_trip(run_db, tmp_path):
    db, rec = run_db
    out = write_bundle(db, tmp_path / "x.cucobundle", llm_recordings=[rec])
    opened = open_bundle(out, into=tmp_path / "open")
    assert opened.manifest["version"] == 1 and opened.main_run()["workload"] == "gemm_allgather"
    assert opened.measured() == "NVIDIA H200, driver 580.159.04, 2026-12-03"
    assert [p.name for p in opened.llm_recordings] == ["answers.jsonl"]
    tl = json.loads((opened.directory / "timelines/evaluation-1.json").read_text())
    assert tl["events"] == TIMELINE
    assert json.loads((opened.directory / "provenance.json").read_text())["1"]["gpu"] == "NVIDIA H200"
    with opened.open_store() as st:
        assert st.readonly and st.evaluations()[0]["result"]["timeline"] == TIMELINE
    assert "best #1 seed: 0.5000 ms" in opened.summary()


def _rezip(src, dst, *, rename=None, extra=None, manifest=None):
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            data = a.read(info)
            if info.filename == MANIFEST and manifest is not None:
                data = json.dumps(manifest(json.loads(data))).encode()
            b.writestr((rename or {}).get(info.filename, info.filename), data)
        for name, data in (extra or {}).items():
            b.writestr(name, data)
    return dst


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil", "llm/../../evil.jsonl", "timelines\\..\\x.json",
                                  "notes.txt"])
def test_hostile_member_names_are_refused(run_db, tmp_path, name):
    db, _ = run_db
    good = write_bundle(db, tmp_path / "good.cucobundle")
    bad = _rezip(good, tmp_path / "bad.cucobundle", extra={name: b"x"})
    with pytest.raises(BundleError, match="refusing this bundle"):
        open_bundle(bad, into=tmp_path / "o")
    assert not (tmp_path / "evil.txt").exists()


def test_unknown_version_wrong_checksum_and_unlisted_are_refused(run_db, tmp_path):
    db, _ = run_db
    good = write_bundle(db, tmp_path / "good.cucobundle")
    v2 = _rezip(good, tmp_path / "v2.cucobundle", manifest=lambda m: {**m, "version": 2})
    with pytest.raises(BundleError, match="version 2 is not supported"):
        open_bundle(v2)
    other = _rezip(good, tmp_path / "o.cucobundle", manifest=lambda m: {**m, "format": "zip"})
    with pytest.raises(BundleError, match="not a cuco-bundle"):
        open_bundle(other)
    unlisted = _rezip(good, tmp_path / "u.cucobundle", extra={"timelines/evaluation-9.json": b"{}"})
    with pytest.raises(BundleError, match="not in its manifest"):
        open_bundle(unlisted)
    forged = _rezip(good, tmp_path / "f.cucobundle",
                    manifest=lambda m: {**m, "files": {**m["files"], "run.sqlite": "0" * 64}})
    with pytest.raises(BundleError, match="checksum"):
        open_bundle(forged, into=tmp_path / "f")
    (tmp_path / "plain.cucobundle").write_text("hello")
    with pytest.raises(BundleError, match="not a zip"):
        open_bundle(tmp_path / "plain.cucobundle")


def test_cli_bundle_and_open(run_db, tmp_path, capsys):
    db, _ = run_db
    out = tmp_path / "cli.cucobundle"
    assert cli.main(["bundle", str(db), "-o", str(out)]) == 0
    assert cli.main(["open", str(out), "--into", str(tmp_path / "u")]) == 0
    text = capsys.readouterr().out
    assert "measured on NVIDIA H200, driver 580.159.04, 2026-12-03" in text and "CUCO_BUNDLE=" in text
    bad = _rezip(out, tmp_path / "v9.cucobundle", manifest=lambda m: {**m, "version": 9})
    assert cli.main(["open", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "version 9 is not supported" in err


def test_bundle_panel_opens_and_badges(run_db, tmp_path):
    db, _ = run_db
    out = write_bundle(db, tmp_path / "p.cucobundle")
    panel = BundlePanel(str(out))  # opens at once
    assert panel.opened is not None and 'data-badge="replayed"' in panel.status.value
    assert "NVIDIA H200" in panel.status.value and len(panel.views.children) == 2
    empty = BundlePanel("")
    assert "CUCO_BUNDLE" in empty.status.value
    empty.path.value = str(tmp_path / "missing.cucobundle")
    empty.button.click()
    assert "no bundle at" in empty.status.value and empty.opened is None
