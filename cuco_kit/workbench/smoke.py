"""Smoke runs of the notebooks: the switches, the fake LLM they talk to, and the check that nothing is left.

CI runs every notebook headless under CUCO_SMOKE=1 (tiny budgets, no GPU time, a local fake OpenAI-compatible
server answering with labelled fixtures); the browser test adds CUCO_BROWSER_TEST=1, so a real browser clicks
instead of the notebook approving by itself. A notebook's last check is `leftovers()`: no stray thread, fake
server or child process.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cuco_kit.llm import Ledger, LedgeredClient, LLMClient, OpenAICompatibleClient
from cuco_kit.llm.fake_server import FakeOpenAIServer, Scripted
from cuco_kit.store import Store

SMOKE_ENV = "CUCO_SMOKE"
BROWSER_ENV = "CUCO_BROWSER_TEST"


# ---- switches ------------------------------------------------------------------------------------------------

def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def enabled() -> bool:
    """True under CUCO_SMOKE=1: tiny budgets, the fake LLM server, no GPU time (CI runs every notebook so)."""
    return _flag(SMOKE_ENV)


def browser_test() -> bool:
    """True under CUCO_BROWSER_TEST=1: a real browser drives the notebook and clicks Approve itself."""
    return _flag(BROWSER_ENV)


def auto_approve() -> bool:
    """Whether a headless smoke run should approve proposals by itself (nobody is there to click)."""
    return enabled() and not browser_test()


# ---- the fake LLM --------------------------------------------------------------------------------------------

_SERVERS: list[FakeOpenAIServer] = []
_SERVERS_LOCK = threading.Lock()


def fake_llm_for_smoke(fixtures: Iterable[Scripted | Mapping[str, Any]] | None = None, *, store: Store | None = None,
                       run_id: int | None = None, **config: Any) -> tuple[LLMClient, FakeOpenAIServer]:
    """Start the fake OpenAI-compatible server on 127.0.0.1 with scripted FIXTURE answers and return
    (client, server). Every answer is labelled a fixture (model "fixture-<name>"). With `store`, calls go
    through the ledger into that store. Stop it with server.stop() or `cleanup()`.

    `fixtures`: Scripted entries (cuco_kit.llm.fake_server.answer(...)) or dicts of their fields."""
    script = [f if isinstance(f, Scripted) else Scripted.from_dict(dict(f)) for f in (fixtures or [])]
    server = FakeOpenAIServer(script).start()
    with _SERVERS_LOCK:
        _SERVERS.append(server)
    client: LLMClient = OpenAICompatibleClient(server.config(**config))
    if store is not None:
        client = LedgeredClient(client, Ledger(store, run_id))
    return client, server


def cleanup() -> int:
    """Stop every fake server started here; returns how many were still running."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS)
        _SERVERS.clear()
    running = [s for s in servers if s.running]
    for s in running:
        s.stop()
    return len(running)


def running_fake_servers() -> list[FakeOpenAIServer]:
    with _SERVERS_LOCK:
        return [s for s in _SERVERS if s.running]


# ---- leaving nothing behind ----------------------------------------------------------------------------------

def child_processes(pid: int | None = None) -> list[tuple[int, str]]:
    """Living descendants of `pid` (default: this process) as (pid, command line), read from /proc."""
    root = os.getpid() if pid is None else pid
    parent_of: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if fields and fields[0] != "Z":
            parent_of[int(d.name)] = int(fields[1])
    out, frontier = [], {root}
    while frontier:
        kids = {p for p, pp in parent_of.items() if pp in frontier}
        frontier = kids
        for k in sorted(kids):
            try:
                cmd = (Path("/proc") / str(k) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                cmd = "?"
            out.append((k, cmd))
    return out


def leftovers(baseline: Iterable[int] = (), *, wait_s: float = 5.0) -> list[str]:
    """What a notebook left running: threads started since `baseline` (thread idents at its start) that are
    non-daemon or named cuco-*, running fake servers, and child processes. Waits up to `wait_s` for things
    that are already ending (a throttle's last timer, a joined worker)."""
    known = set(baseline)
    deadline = time.monotonic() + wait_s
    while True:
        threads = [t for t in threading.enumerate()
                   if t is not threading.main_thread() and t.ident not in known and t.is_alive()
                   and (not t.daemon or t.name.startswith("cuco-"))]
        problems = [f"thread {t.name!r} (daemon={t.daemon}) still alive" for t in threads]
        problems += [f"fake LLM server on port {s.port} still running" for s in running_fake_servers()]
        problems += [f"child process {pid}: {cmd[:120]}" for pid, cmd in child_processes()]
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.1)


def thread_baseline() -> list[int]:
    """Idents of the threads alive now (call at a notebook's start; pass to `leftovers`)."""
    return [t.ident for t in threading.enumerate() if t.ident is not None]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> None:
    """Poll `predicate` until true or raise TimeoutError naming `what` (smoke runs and set-up only: an
    interactive cell never blocks on a click)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(poll)
