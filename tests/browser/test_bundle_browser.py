"""A run bundle opened in notebook 00 in a real browser, on this machine with no GPU: made with `cuco bundle` from a
committed recorded run, its path typed into the bundle field, Open pressed; the run is drawn, badged replayed
with the GPU, driver and date it was measured on, and no red box appears."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(360)

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "recordings" / "gemm_allgather-symm4-search-seed0.sqlite"


def test_00_opens_a_bundle_without_gpu(lab: Any):
    bundle = lab.root / "shared-run.cucobundle"
    done = subprocess.run([sys.executable, "-m", "cuco_kit", "bundle", str(RECORDING), "-o", str(bundle)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    page = lab.open("00_quickstart.ipynb")
    try:
        lab.run_all(page)
        field = page.locator(".jp-OutputArea input[placeholder='path/to/run.cucobundle']")
        field.wait_for(timeout=60_000)
        assert field.count() == 1 and "CUCO_BUNDLE" in page.inner_text("body")
        field.fill(str(bundle))
        page.locator(".jp-OutputArea button", has_text="Open").first.click()
        summary = page.locator(".cuco-bundle-summary")
        summary.wait_for(timeout=60_000)
        text = page.inner_text("body")
        assert "measured on NVIDIA H200, driver 580.159.04, 2026-12-03" in text
        badge = summary.locator("xpath=preceding-sibling::span[contains(@class, 'cuco-badge')]").first
        assert badge.get_attribute("data-badge") == "replayed"
        page.wait_for_function("() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter("
                               "gd => String((gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '')"
                               ".startsWith('Lineage')).length >= 2", timeout=60_000)
        assert lab.red_boxes(page) == []
        lab.shot(page, "00_bundle", at=".cuco-bundle-summary")
    finally:
        lab.close(page)
