"""Smoke-run helpers: the switches, the fake LLM, waiting, and the leftover check every notebook ends with."""
from __future__ import annotations

import subprocess
import threading

import pytest

from cuco_kit.llm.fake_server import answer
from cuco_kit.store import Store
from cuco_kit.workbench import smoke


@pytest.mark.parametrize("smoke_env,browser_env,enabled,auto", [
    ("", "", False, False), ("1", "", True, True), ("1", "1", True, False), ("off", "1", False, False)])
def test_switches(monkeypatch, smoke_env, browser_env, enabled, auto):
    monkeypatch.setenv(smoke.SMOKE_ENV, smoke_env)
    monkeypatch.setenv(smoke.BROWSER_ENV, browser_env)
    assert smoke.enabled() is enabled
    assert smoke.browser_test() is bool(browser_env)
    assert smoke.auto_approve() is auto


def test_wait_for_returns_when_true_and_names_what_timed_out():
    hits = iter([False, False, True])
    smoke.wait_for(lambda: next(hits), 5, "three polls", poll=0.01)
    with pytest.raises(TimeoutError, match="the thing: not done"):
        smoke.wait_for(lambda: False, 0.05, "the thing", poll=0.01)


def test_fake_llm_answers_with_labelled_fixtures_through_the_ledger():
    with Store(":memory:") as st:
        rid = st.create_run(workload="toy", config={}, seed=0, badge="simulated")
        client, server = smoke.fake_llm_for_smoke([answer("hello", "FIXTURE hi")], store=st, run_id=rid,
                                                  max_retries=0)
        try:
            got = client.complete([{"role": "user", "content": "say hi"}], purpose="test")
            assert got.text == "FIXTURE hi" and got.fixture and got.model == "fixture-hello"
            assert [c["purpose"] for c in st.llm_calls(rid)] == ["test"]
            assert smoke.running_fake_servers() == [server]
        finally:
            assert smoke.cleanup() == 1
        assert smoke.running_fake_servers() == []


def test_leftover_check_sees_threads_servers_and_children():
    """The notebooks' final check is not vacuous: each kind of leftover is reported, and gone once ended."""
    base = smoke.thread_baseline()
    assert smoke.leftovers(base, wait_s=0) == []
    stop = threading.Event()
    th = threading.Thread(target=stop.wait, name="cuco-test-stray", daemon=True)
    th.start()
    _, server = smoke.fake_llm_for_smoke([])
    child = subprocess.Popen(["sleep", "30"])
    try:
        left = " | ".join(smoke.leftovers(base, wait_s=0))
        assert "cuco-test-stray" in left and f"port {server.port}" in left and f"child process {child.pid}" in left
    finally:
        stop.set()
        th.join(5)
        assert smoke.cleanup() == 1
        child.kill()
        child.wait()
    assert smoke.leftovers(base, wait_s=2) == []
