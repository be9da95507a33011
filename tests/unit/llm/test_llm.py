"""The LLM layer against the fake OpenAI-compatible server over real HTTP with the real `openai` client:
retries, truncation, the ledger in a real Store, the dollar budget, record/replay, prices and embeddings."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from cuco_kit.errors import CucoError
from cuco_kit.llm import (
    Completion,
    Ledger,
    LedgeredClient,
    LLMBudgetExceeded,
    LLMClient,
    LLMConfig,
    LLMError,
    LLMReplayMiss,
    LLMRequestRejected,
    LLMTruncated,
    LLMUnavailable,
    OpenAICompatibleClient,
    RecordingClient,
    ReplayClient,
    prices,
    request_hash,
)
from cuco_kit.llm.embeddings import embed
from cuco_kit.llm.fake_server import (
    FakeOpenAIServer,
    answer,
    hashed_embedding,
    malformed,
    rate_limit,
    server_error,
    slow,
    truncated,
)
from cuco_kit.llm.ledger import prompt_tokens_bound
from cuco_kit.llm.openai_client import DEFAULT_MODEL, LOCAL_DUMMY_KEY, backoff_delay
from cuco_kit.store import Store

MSGS = [{"role": "system", "content": "You rewrite CUDA kernels."},
        {"role": "user", "content": "Replace the host AllGather with LSA stores to peers."}]
PROMPT_WORDS = sum(len(m["content"].split()) for m in MSGS)


class SleepLog:
    """Records requested backoff delays instead of sleeping, so retry tests take milliseconds."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, s: float) -> None:
        self.delays.append(s)


def make_client(srv: FakeOpenAIServer, sleep: SleepLog | None = None, **cfg) -> OpenAICompatibleClient:
    cfg = {"timeout_s": 2.0, "max_retries": 2, "backoff_base_s": 0.001, "backoff_cap_s": 5.0, **cfg}
    return OpenAICompatibleClient(srv.config(**cfg), sleep=sleep or SleepLog(), rng=random.Random(0))


@pytest.fixture
def store():
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture
def run_id(store):
    return store.create_run(workload="gemm_allgather", config={})


def test_normal_call_is_recorded_in_the_store_ledger(store, run_id):
    with FakeOpenAIServer([answer("stage-a", "__global__ void k() {}")]) as srv:
        ledger = Ledger(store, run_id, budget_dollars=None)
        client = LedgeredClient(make_client(srv), ledger)
        assert isinstance(client, LLMClient)
        c = client.complete(MSGS, purpose="fastpath.stage_a", temperature=0.2, max_tokens=100)
        sent = srv.chat_requests()[0].body
    assert c.text == "__global__ void k() {}"
    assert c.model == "fixture-stage-a" and c.fixture and c.finish_reason == "stop" and c.attempts == 1
    assert (c.prompt_tokens, c.completion_tokens) == (PROMPT_WORDS, 4)  # words, approximately tokens
    assert sent["messages"] == MSGS and sent["model"] == "fixture"
    assert sent["temperature"] == 0.2 and sent["max_tokens"] == 100
    rows = store.llm_calls(run_id)
    assert len(rows) == 1
    row = rows[0]
    assert row["model"] == "fixture-stage-a" and row["purpose"] == "fastpath.stage_a" and row["ok"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (PROMPT_WORDS, 4)
    assert row["request_hash"] == request_hash(MSGS, "fastpath.stage_a") and row["error"] == ""
    assert row["latency_s"] == pytest.approx(c.latency_s) and 0 < row["latency_s"] < 2
    # "fixture-stage-a" has no price: tokens only
    assert row["dollars"] is None and c.dollars is None
    assert ledger.totals()["unpriced_calls"] == 1 and ledger.spent_dollars == 0


def test_priced_call_records_dollars_from_the_config_price_table(store, run_id):
    with FakeOpenAIServer([answer("priced", "a b c d")]) as srv:
        client = LedgeredClient(make_client(srv, prices={"fixture-priced": (1.0, 2.0)}), Ledger(store, run_id))
        c = client.complete(MSGS, purpose="judge")
    expected = (PROMPT_WORDS * 1.0 + 4 * 2.0) / 1e6
    assert c.dollars == pytest.approx(expected)
    assert store.llm_calls(run_id)[0]["dollars"] == pytest.approx(expected)


def test_rate_limit_then_success_honours_retry_after(store, run_id):
    sleep = SleepLog()
    with FakeOpenAIServer([rate_limit("busy", retry_after_s=0.25), answer("ok", "done")]) as srv:
        client = LedgeredClient(make_client(srv, sleep), Ledger(store, run_id))
        c = client.complete(MSGS, purpose="mutate")
        assert [r.answered_with for r in srv.chat_requests()] == ["busy", "ok"]
    assert c.text == "done" and c.attempts == 2
    assert len(sleep.delays) == 1 and sleep.delays[0] >= 0.25  # Retry-After beat the 1 ms backoff
    assert [r["ok"] for r in store.llm_calls(run_id)] == [True]


def test_server_errors_exhaust_retries_into_llm_unavailable(store, run_id):
    sleep = SleepLog()
    with FakeOpenAIServer([server_error("boom", status=502, times=0)]) as srv:
        client = LedgeredClient(make_client(srv, sleep, max_retries=3), Ledger(store, run_id))
        with pytest.raises(LLMUnavailable, match="HTTP 502") as ei:
            client.complete(MSGS, purpose="mutate")
        assert len(srv.chat_requests()) == 4
    assert ei.value.attempts == 4 and isinstance(ei.value, CucoError)
    assert len(sleep.delays) == 3
    assert sleep.delays[0] < sleep.delays[2]  # exponential (base 1 ms: 0.5-1 ms, then 2-4 ms)
    (row,) = store.llm_calls(run_id)
    assert not row["ok"] and "LLMUnavailable" in row["error"] and row["prompt_tokens"] == 0


def test_timeout_is_retried_then_unavailable():
    with FakeOpenAIServer([slow("stuck", "late", delay_s=5, times=0)]) as srv:
        client = make_client(srv, timeout_s=0.2, max_retries=1)
        with pytest.raises(LLMUnavailable, match="timed out"):
            client.complete(MSGS, purpose="mutate")
        assert len(srv.chat_requests()) == 2


def test_timeout_then_success():
    with FakeOpenAIServer([slow("stuck", "late", delay_s=5), answer("ok", "fine")]) as srv:
        c = make_client(srv, timeout_s=0.2).complete(MSGS, purpose="mutate")
    assert c.text == "fine" and c.attempts == 2 and c.latency_s >= 0.2


def test_malformed_body_is_retried():
    with FakeOpenAIServer([malformed("garbage"), answer("ok", "fine")]) as srv:
        c = make_client(srv).complete(MSGS, purpose="mutate")
    assert c.text == "fine" and c.attempts == 2


def test_other_4xx_is_not_retried():
    # an empty script answers 400 "fixture script exhausted"
    with FakeOpenAIServer([]) as srv:
        with pytest.raises(LLMRequestRejected, match="HTTP 400.*exhausted") as ei:
            make_client(srv).complete(MSGS, purpose="mutate")
        assert len(srv.chat_requests()) == 1
    assert ei.value.status == 400


def test_truncated_answer_raises_and_is_recorded_with_its_tokens(store, run_id):
    with FakeOpenAIServer([truncated("cut", "half of a kernel")]) as srv:
        client = LedgeredClient(make_client(srv), Ledger(store, run_id))
        with pytest.raises(LLMTruncated) as ei:
            client.complete(MSGS, purpose="fastpath.stage_b")
        assert len(srv.chat_requests()) == 1  # not retried
    assert ei.value.completion.text == "half of a kernel"
    assert ei.value.completion.finish_reason == "length"
    (row,) = store.llm_calls(run_id)
    assert not row["ok"] and row["error"].startswith("truncated")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (PROMPT_WORDS, 4)


def test_budget_refuses_before_sending_and_is_shared_by_all_clients(store, run_id):
    price = {"fixture": (1e3, 1e3), "fixture-a": (1e3, 1e3)}  # $0.001 per token, asked and answering model
    worst = (prompt_tokens_bound(MSGS) + 10) * 1e-3  # what a call with max_tokens=10 could cost
    with FakeOpenAIServer([answer("a", "x y", times=0)]) as srv:
        ledger = Ledger(store, run_id, budget_dollars=worst + 0.01, prices=price)
        search_side = LedgeredClient(make_client(srv), ledger)
        eval_side = LedgeredClient(make_client(srv), ledger)
        c = search_side.complete(MSGS, purpose="mutate", max_tokens=10)
        cost = (PROMPT_WORDS + 2) * 1e-3
        assert c.dollars == pytest.approx(cost)  # priced by the ledger's table
        assert ledger.spent_dollars == pytest.approx(cost)
        # what is left ($0.025) is less than the next call's worst case: refused before sending
        with pytest.raises(LLMBudgetExceeded, match="not sent"):
            eval_side.complete(MSGS, purpose="evaluate.judge", max_tokens=10)
        assert len(srv.chat_requests()) == 1  # the refused call never reached the server
    rows = store.llm_calls(run_id)
    assert [r["ok"] for r in rows] == [True, False]
    assert rows[1]["purpose"] == "evaluate.judge" and rows[1]["error"].startswith("refused")
    assert store.llm_dollars(run_id) == pytest.approx(cost) and cost <= ledger.budget_dollars
    # a resumed run starts from the store's spend, not from a fresh budget
    assert Ledger(store, run_id, budget_dollars=100.0).spent_dollars == pytest.approx(cost)


def test_zero_budget_sends_nothing():
    with FakeOpenAIServer([answer("a", "x")]) as srv:
        client = Ledger(None, None, budget_dollars=0.0).wrap(make_client(srv))
        with pytest.raises(LLMBudgetExceeded):
            client.complete(MSGS, purpose="mutate")
        assert srv.requests == []


def test_unknown_price_records_tokens_against_the_token_budget(store, run_id):
    with FakeOpenAIServer([answer("local-llama", "w " * 7, times=2)]) as srv:
        ledger = Ledger(store, run_id, budget_dollars=0.01)
        client = ledger.wrap(make_client(srv))
        client.complete(MSGS, purpose="a")
        client.complete(MSGS, purpose="b")  # not refused: within the default token budget
    rows = store.llm_calls(run_id)
    assert [r["dollars"] for r in rows] == [None, None]
    assert [r["completion_tokens"] for r in rows] == [7, 7]
    assert ledger.spent_dollars == 0 and ledger.totals()["prompt_tokens"] == 2 * PROMPT_WORDS
    assert ledger.spent_tokens == ledger.totals()["unpriced_tokens"] == 2 * (PROMPT_WORDS + 7)


def test_record_then_replay_without_the_server(tmp_path):
    rec = tmp_path / "rec" / "calls.jsonl"
    judge_msgs = MSGS[:1] + [{"role": "user", "content": "why did it fail?"}]
    with FakeOpenAIServer([answer("rewrite", "first rewrite"), answer("rewrite2", "second rewrite"),
                           answer("judge", "missing wait"), truncated("cut", "part")]) as srv:
        client = RecordingClient(make_client(srv), rec)
        live = [client.complete(MSGS, purpose="stage_a").text, client.complete(MSGS, purpose="stage_a").text,
                client.complete(judge_msgs, purpose="judge").text]
        with pytest.raises(LLMTruncated):
            client.complete(MSGS, purpose="stage_b")
    assert not srv.running
    assert len(rec.read_text().splitlines()) == 4

    replay = ReplayClient(rec)
    assert isinstance(replay, LLMClient) and len(replay) == 4
    ledger = Ledger(None, None, budget_dollars=0.5)
    replayed_client = ledger.wrap(replay)
    replayed = [replayed_client.complete(MSGS, purpose="stage_a").text,
                replayed_client.complete(MSGS, purpose="stage_a").text,
                replayed_client.complete(judge_msgs, purpose="judge").text]
    assert replayed == live == ["first rewrite", "second rewrite", "missing wait"]
    # asked more often than recorded: the last answer again
    c = replay.complete(MSGS, purpose="stage_a")
    assert c.text == "second rewrite" and c.model == "fixture-rewrite2" and c.dollars == 0.0 and c.fixture
    with pytest.raises(LLMTruncated) as ei:
        replay.complete(MSGS, purpose="stage_b")
    assert ei.value.completion.text == "part"
    # the purpose is part of the key, and so is every message byte
    with pytest.raises(LLMReplayMiss, match="judge"):
        replay.complete(MSGS, purpose="judge")
    with pytest.raises(LLMReplayMiss):
        replay.complete(MSGS[:1] + [{"role": "user", "content": "Replace the host AllGather."}], purpose="stage_a")
    assert ledger.spent_dollars == 0 and ledger.totals()["calls"] == 3


def test_replay_rejects_missing_and_corrupt_files(tmp_path):
    with pytest.raises(LLMError, match="no LLM recording"):
        ReplayClient(tmp_path / "absent.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 1, "hash": "x", "purpose": "p", "completion": {}}\nnot json\n')
    with pytest.raises(LLMError, match="bad.jsonl:2"):
        ReplayClient(bad)


def test_request_hash_is_canonical():
    a = [{"role": "user", "content": "x"}]
    b = [{"content": "x", "role": "user"}]
    assert request_hash(a, "p") == request_hash(b, "p")
    assert request_hash(a, "p") != request_hash(a, "q")
    assert request_hash(a, "p") != request_hash([{"role": "user", "content": "x "}], "p")
    assert len(request_hash(a, "p")) == 64


def test_config_from_environment(monkeypatch):
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CUCO_MODEL", "CUCO_EMBEDDING_MODEL"):
        monkeypatch.delenv(var, raising=False)
    cfg = LLMConfig()
    assert cfg.base_url == "https://api.openai.com/v1" and cfg.model == DEFAULT_MODEL
    with pytest.raises(LLMError, match="OPENAI_API_KEY"):
        cfg.resolved_api_key()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    monkeypatch.setenv("CUCO_MODEL", "qwen2.5-coder:32b")
    cfg = LLMConfig()
    assert (cfg.base_url, cfg.model) == ("http://localhost:11434/v1", "qwen2.5-coder:32b")
    assert cfg.resolved_api_key() == LOCAL_DUMMY_KEY
    assert LLMConfig(model="explicit").model == "explicit"
    monkeypatch.setenv("OPENAI_API_KEY", "probe-value-from-env")
    cfg = LLMConfig()
    assert cfg.resolved_api_key() == "probe-value-from-env" and "probe-value" not in repr(cfg)
    with pytest.raises(LLMError, match="max_tokens_param"):
        LLMConfig(max_tokens_param="max_len")
    with pytest.raises(LLMError, match="timeout_s"):
        LLMConfig(timeout_s=0)


def test_max_completion_tokens_param_is_sent_when_configured():
    with FakeOpenAIServer([answer("a", "x")]) as srv:
        make_client(srv, max_tokens_param="max_completion_tokens", max_tokens=64).complete(MSGS, purpose="p")
        body = srv.chat_requests()[0].body
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body and "temperature" not in body


def test_bad_messages_are_refused_before_sending():
    with FakeOpenAIServer([answer("a", "x")]) as srv:
        client = make_client(srv)
        with pytest.raises(LLMError, match="non-empty"):
            client.complete([], purpose="p")
        with pytest.raises(LLMError, match=r"messages\[0\]"):
            client.complete([{"text": "hi"}], purpose="p")
        assert srv.requests == []


def test_backoff_grows_is_capped_and_jittered():
    cfg = LLMConfig(base_url="http://127.0.0.1:1/v1", backoff_base_s=1.0, backoff_cap_s=8.0)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (7, 8.0)]:
        ds = [backoff_delay(attempt, cfg, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in ds)
        assert len(set(ds)) > 1
    assert backoff_delay(1, cfg, rng, retry_after=5.0) == 5.0
    assert backoff_delay(1, cfg, rng, retry_after=60.0) == 8.0  # Retry-After is capped too


def test_price_lookup():
    assert prices.lookup("gpt-4o-mini") == prices.PRICES["gpt-4o-mini"]
    assert prices.lookup("gpt-4o-mini-2024-07-18") == prices.PRICES["gpt-4o-mini"]
    assert prices.lookup("openai/gpt-4o") == prices.PRICES["gpt-4o"]
    assert prices.lookup("gpt-4o-audio-preview") is None
    assert prices.lookup("fixture-x") is None
    assert prices.lookup("fixture-x", {"fixture-x": (3.0, 4.0)}) == (3.0, 4.0)
    assert prices.cost("gpt-4o", 1_000_000, 0) == pytest.approx(prices.PRICES["gpt-4o"][0])
    assert prices.cost("gpt-4o", None, 5) is None and prices.cost("nope", 5, 5) is None


def test_embeddings_through_the_fake_server():
    with FakeOpenAIServer(embedding_dim=16) as srv:
        vecs = embed(["alpha beta", "gamma", "alpha beta"], srv.config(), batch_size=2)
        reqs = srv.requests
    assert len(vecs) == 3 and all(len(v) == 16 for v in vecs)
    assert vecs[0] == pytest.approx(hashed_embedding("alpha beta", 16), abs=1e-6)
    assert vecs[0] == vecs[2] and vecs[0] != vecs[1]
    assert [len(r.body["input"]) for r in reqs] == [2, 1]
    assert all(r.body["encoding_format"] == "float" for r in reqs)
    assert embed([], LLMConfig(base_url="http://127.0.0.1:9/v1")) == []  # no request for nothing


def test_engine_imports_without_openai():
    code = ("import sys; import cuco_kit.llm, cuco_kit.llm.ledger, cuco_kit.llm.replay, cuco_kit.llm.fake_server, "
            "cuco_kit.llm.embeddings; assert 'openai' not in sys.modules, 'openai imported eagerly'")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_completion_round_trips_through_json():
    c = Completion(text="t", model="m", prompt_tokens=1, completion_tokens=2, latency_s=0.1, finish_reason="stop",
                   dollars=None)
    assert Completion(**json.loads(json.dumps(c.__dict__))) == c
