"""02_search in a real browser: JupyterLab on 127.0.0.1, Debian's Chromium driven by Playwright.

JupyterLab serves a temporary copy of notebooks/ (random free port, a token, --no-browser). The kernel gets
CUCO_SMOKE=1 (tiny budgets, no GPU time) and CUCO_BROWSER_TEST=1, so the notebook does NOT approve by itself:
the proposal waits until this test clicks Approve in the page. The test then checks, in the plotly figures'
own data in the DOM, that the lineage tree gained a node and the latency plot an evaluation, keeps a
screenshot in test-artifacts/browser-02_search.png, presses Stop and shuts JupyterLab down. No browser is
downloaded: Playwright launches /usr/bin/chromium (scripts/test.sh installs Debian's package).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACT = ROOT / "test-artifacts" / "browser-02_search.png"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TAG_ENV = "CUCO_BROWSER_TEST_TAG"

# Sums the points of the lineage tree and the evaluations of the latency plot, read from plotly's own data.
PLOT_COUNTS_JS = """() => {
  const out = {lineage: null, latency: null, plots: 0};
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    out.plots += 1;
    const title = (gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '';
    const data = gd.data || [];
    if (String(title).startsWith('Lineage')) {
      out.lineage = data.filter(t => t.name === 'passed' || String(t.name).startsWith('failed'))
                        .reduce((n, t) => n + (t.x ? t.x.length : 0), 0);
    } else if (String(title).startsWith('Latency')) {
      const best = data.find(t => t.name === 'best so far');
      out.latency = best && best.x ? best.x.length : 0;
    }
  }
  return out;
}"""

# The dashboard's "pending: N" (proposals waiting in the approval queue).
PENDING_JS = """() => { const m = document.body.innerText.match(/pending: (\\d+)/); return m ? Number(m[1]) : -1; }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tagged(tag: str) -> list[int]:
    needle = f"{TAG_ENV}={tag}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0") and \
                        (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.fixture()
def jupyterlab(tmp_path: Path):
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium); "
                    "scripts/test.sh does this")
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    port, token, tag = _free_port(), uuid.uuid4().hex, uuid.uuid4().hex
    cfg = tmp_path / "jupyter"
    env = {**os.environ, "CUCO_SMOKE": "1", "CUCO_BROWSER_TEST": "1", TAG_ENV: tag,
           "JUPYTER_CONFIG_DIR": str(cfg / "config"), "JUPYTER_RUNTIME_DIR": str(cfg / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(cfg / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(cfg / "workspaces"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", "--allow-root", f"--ServerApp.root_dir={root}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate", "--ServerApp.port_retries=0"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                json.load(r)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()[-3000:])
            time.sleep(0.5)
    try:
        yield base, token, root
    finally:
        try:
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=10).close()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()
        deadline = time.monotonic() + 15
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.3)
        left = _tagged(tag)
        for pid in left:  # started by this test: end them by id
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not left, f"processes left after JupyterLab shut down: {left}"


def run_all(page, url: str) -> None:
    """Open a notebook, wait for its kernel to be idle, then Run All."""
    page.goto(url)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                           "window.jupyterapp.shell.currentWidget.sessionContext && "
                           "window.jupyterapp.shell.currentWidget.sessionContext.session && "
                           "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel && "
                           "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status "
                           "=== 'idle'", timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def test_02_search_approve_in_browser_updates_lineage_and_latency(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token, _ = jupyterlab
    ARTIFACT.parent.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            run_all(page, f"{base}/lab/tree/02_search.ipynb?token={token}")

            approve = page.locator(".jp-OutputArea button", has_text="Approve").first
            approve.wait_for(state="visible", timeout=180_000)
            # The seed and the baseline are evaluated before any proposal: wait for both on the lineage tree.
            page.wait_for_function(f"() => ({PLOT_COUNTS_JS})().lineage >= 2", timeout=60_000)
            before = page.evaluate(PLOT_COUNTS_JS)
            assert before["lineage"] >= 2, before
            pending_before = page.evaluate(PENDING_JS)
            assert pending_before >= 1

            approve.click()
            page.wait_for_function(f"() => ({PLOT_COUNTS_JS})().lineage > {before['lineage']}", timeout=60_000)
            # The decided proposal leaves the approval queue.
            page.wait_for_function(f"() => ({PENDING_JS})() < {pending_before}", timeout=30_000)

            # The latency view lives in the dashboard's second tab; open it and check it counts the new one.
            page.locator(".lm-TabBar-tabLabel, .p-TabBar-tabLabel", has_text="latency").first.click()
            page.wait_for_function(f"() => ({PLOT_COUNTS_JS})().latency > {before['lineage']}", timeout=30_000)
            after = page.evaluate(PLOT_COUNTS_JS)
            assert after["lineage"] > before["lineage"] and after["latency"] >= after["lineage"], (before, after)
            page.screenshot(path=str(ARTIFACT), full_page=True)

            page.locator(".jp-OutputArea button", has_text="Stop").first.click()
            page.wait_for_function("() => document.body.innerText.includes('state: stopped')", timeout=60_000)
        finally:
            browser.close()
    assert ARTIFACT.is_file() and ARTIFACT.stat().st_size > 10_000


# Points per trace of the lineage tree, by trace name, read from plotly's own data.
LINEAGE_TRACES_JS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = (gd.layout && gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '';
    if (String(title).startsWith('Lineage')) {
      const out = {};
      for (const t of gd.data || []) out[t.name] = t.x ? t.x.length : 0;
      return out;
    }
  }
  return null;
}"""


def test_06_your_kernel_reject_edit_approve_then_search_from_the_result(jupyterlab):
    """06_your_kernel: reject Stage A's first attempt with a note, edit the second, approve the rest, and see the
    search start from the approved result with the fast-path stages as the lineage's first nodes."""
    from playwright.sync_api import sync_playwright

    base, token, _ = jupyterlab
    shot = ROOT / "test-artifacts" / "browser-06_your_kernel.png"
    shot.parent.mkdir(exist_ok=True)
    waiting = "() => document.body.innerText.includes('stage {}, attempt {}: waiting for your decision')"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            run_all(page, f"{base}/lab/tree/06_your_kernel.ipynb?token={token}")

            def button(label: str):
                exact = re.compile(f"^\\s*{label}\\s*$")
                return page.locator(".jp-OutputArea button:enabled:visible").filter(has_text=exact).last

            page.wait_for_function(waiting.format("A", 1), timeout=240_000)
            page.get_by_placeholder("why you reject this attempt").fill("keep the harness stream for the step")
            button("Reject").click()

            page.wait_for_function(waiting.format("A", 2), timeout=120_000)
            button("Edit").click()
            editor = page.locator(".jp-OutputArea textarea:visible").last
            editor.fill(editor.input_value() + "// reviewed in the browser\n")
            button("Submit edit").click()

            page.wait_for_function(waiting.format("B", 1), timeout=240_000)
            assert "rejected" in page.inner_text("body") and "(human" in page.inner_text("body")
            button("Approve").click()
            page.wait_for_function(waiting.format("annotate", 1), timeout=240_000)
            button("Approve").click()

            page.wait_for_function("() => document.body.innerText.includes('Search started from the approved "
                                   "result')", timeout=240_000)
            # JupyterLab renders only what is on screen: bring the dashboard's lineage tree into view.
            page.locator(".js-plotly-plot").first.scroll_into_view_if_needed(timeout=60_000)
            page.wait_for_function(f"() => {{ const t = ({LINEAGE_TRACES_JS})(); return t && "
                                   "t['fast-path stage'] >= 2 && (t['passed'] || 0) >= 1; }", timeout=120_000,
                                   polling=500)
            page.screenshot(path=str(shot), full_page=True)
            button("Stop").click()
            page.wait_for_function("() => document.body.innerText.includes('state: stopped') || "
                                   "document.body.innerText.includes('state: finished')", timeout=60_000)
        finally:
            browser.close()
    assert shot.is_file() and shot.stat().st_size > 10_000
