"""One JupyterLab for the whole browser tier, and the page helpers every browser test uses.

JupyterLab serves a temporary copy of notebooks/ on 127.0.0.1 (random free port, a token, --no-browser); the
kernels get CUCO_SMOKE=1 (tiny budgets, no GPU time) and CUCO_BROWSER_TEST=1 (02_search does not approve by
itself: the test clicks). Starting JupyterLab costs tens of seconds on two loaded cores, so it starts once per
session; each test opens its notebook in a fresh page and shuts the notebook's kernel down at the end. No
browser is downloaded: Playwright launches /usr/bin/chromium (scripts/test.sh installs Debian's package).
Screenshots are kept under test-artifacts/ (gitignored).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TAG_ENV = "CUCO_BROWSER_TEST_TAG"
SCROLL_TRIES = 20  # a live plot redrawn between finding it and scrolling: find it again
VIEWPORT = {"width": 1280, "height": 800}  # what a laptop shows; plots must read at this size

KERNEL_IDLE_JS = ("() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; "
                  "const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel; "
                  "return !!k && k.status === 'idle'; }")
# Every code cell has run (an execution count) and the kernel is idle: Run All has finished.
ALL_RAN_JS = ("() => { const w = window.jupyterapp.shell.currentWidget; const k = w.sessionContext.session.kernel;"
              " const code = w.content.widgets.filter(c => c.model.type === 'code');"
              " return k.status === 'idle' && code.every(c => c.model.executionCount !== null); }")
# Text of every error and stderr output (red boxes) in the notebook.
RED_BOXES_JS = ("() => Array.from(document.querySelectorAll("
                "'.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"], "
                ".jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.error\"]'))"
                ".map(e => e.innerText.slice(0, 400))")
# Runs code in the notebook's kernel and returns what it printed (stdout), for checks the page cannot see.
KERNEL_EXEC_JS = """async (code) => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  let out = '';
  const future = k.requestExecute({code, store_history: false});
  future.onIOPub = (msg) => { if (msg.header.msg_type === 'stream') out += msg.content.text;
                              if (msg.header.msg_type === 'error') out += 'ERROR ' + msg.content.evalue; };
  await future.done;
  return out;
}"""


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


@dataclass
class Lab:
    base: str
    token: str
    root: Path
    browser: Any
    js_errors: list[str] | None = None  # the JavaScript errors of the page opened last

    def open(self, notebook: str) -> Any:
        """A fresh page on `notebook`, its kernel started and idle."""
        page = self.browser.new_page(viewport=VIEWPORT)
        self.js_errors: list[str] = []
        page.on("pageerror", lambda e: self.js_errors.append(str(e)[:300]))
        page.on("console", lambda m: self.js_errors.append(m.text[:300]) if m.type == "error" else None)
        # ?reset: an empty workspace. Without it JupyterLab reopens the notebooks of earlier tests, and Run All
        # goes to whichever of them its tracker calls current, not to this one.
        page.goto(f"{self.base}/lab/tree/{notebook}?reset&token={self.token}")
        page.wait_for_function(KERNEL_IDLE_JS, timeout=120_000)
        return page

    @staticmethod
    def run_all(page: Any, timeout_s: float = 150) -> None:
        """Run All, and wait until every code cell ran and the kernel is idle; fails naming any red box."""
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        try:
            page.wait_for_function(ALL_RAN_JS, timeout=timeout_s * 1000)
        except PlaywrightTimeout:
            raise AssertionError(f"Run All did not finish; red boxes: {page.evaluate(RED_BOXES_JS)}") from None

    @staticmethod
    def kernel(page: Any, code: str) -> str:
        return str(page.evaluate(KERNEL_EXEC_JS, code))

    @staticmethod
    def red_boxes(page: Any) -> list[str]:
        return list(page.evaluate(RED_BOXES_JS))

    @staticmethod
    def scroll_to(page: Any, selector: str) -> None:
        """Scroll the first element matching `selector` into view, found again at each poll: a live plot is
        redrawn, so a held element handle can detach from the page between two steps."""
        for attempt in range(SCROLL_TRIES):
            try:
                page.locator(selector).first.scroll_into_view_if_needed(timeout=60_000)
                return
            except PlaywrightError as exc:
                if "not attached" not in str(exc) or attempt == SCROLL_TRIES - 1:
                    raise
                time.sleep(0.25)

    @staticmethod
    def shot(page: Any, name: str, at: str | None = None) -> Path:
        """A screenshot of the viewport, scrolled to the first element matching the selector `at`."""
        if at is not None:
            Lab.scroll_to(page, at)
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"browser-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    @staticmethod
    def close(page: Any) -> None:
        """Shut the notebook's kernel down (frees the CPU for the next test) and close the page."""
        try:
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        finally:
            page.close()


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium); "
                    "scripts/test.sh does this")
    tmp_path = tmp_path_factory.mktemp("lab")
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    port, token, tag = _free_port(), uuid.uuid4().hex, uuid.uuid4().hex
    cfg = tmp_path / "jupyter"
    env = {**os.environ, "CUCO_SMOKE": "1", "CUCO_BROWSER_TEST": "1", TAG_ENV: tag,
           "JUPYTER_CONFIG_DIR": str(cfg / "config"), "JUPYTER_RUNTIME_DIR": str(cfg / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(cfg / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(cfg / "workspaces"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    news = cfg / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')  # no news popup over the screenshots
    tracker = cfg / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')  # every cell in the DOM, scrolled into view or not
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
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS, headless=True)
    try:
        yield Lab(base, token, root, browser)
    finally:
        browser.close()
        pw.stop()
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
        for pid in left:  # started by this session: end them by id
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not left, f"processes left after JupyterLab shut down: {left}"
