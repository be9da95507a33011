"""The fake OpenAI-compatible server, spoken to over raw HTTP (urllib) so its wire behaviour is checked
independently of the openai client."""
from __future__ import annotations

import base64
import json
import math
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest

from cuco_kit.llm.fake_server import (
    FakeOpenAIServer,
    Scripted,
    answer,
    hashed_embedding,
    malformed,
    rate_limit,
    server_error,
    slow,
    truncated,
)


def post(url: str, body: object, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def chat(srv: FakeOpenAIServer, user: str, system: str | None = None) -> tuple[int, dict[str, str], bytes]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return post(srv.base_url + "/chat/completions", {"model": "anything", "messages": msgs})


@pytest.fixture
def no_stray_threads():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            return
        time.sleep(0.02)
    pytest.fail(f"threads left behind: {extra}")


def test_binds_loopback_only_and_stops_cleanly(no_stray_threads):
    srv = FakeOpenAIServer([answer("a", "x")]).start()
    host, port = srv.address
    assert host == "127.0.0.1"
    assert port > 0
    assert srv.base_url == f"http://127.0.0.1:{port}/v1"
    assert srv._httpd.socket.getsockname()[0] == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    srv.stop()
    assert not srv.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    srv.stop()  # idempotent


def test_context_manager_and_two_servers_get_distinct_ports(no_stray_threads):
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        assert a.port != b.port
    assert not a.running and not b.running


def test_answers_are_labelled_fixtures_with_word_count_usage():
    with FakeOpenAIServer([answer("stage-a", "one two three four")]) as srv:
        status, headers, body = chat(srv, "please rewrite this kernel", system="you are careful")
    assert status == 200
    assert headers["x-cuco-fixture"] == "true"
    assert headers["x-cuco-fixture-name"] == "stage-a"
    d = json.loads(body)
    assert d["model"] == "fixture-stage-a"
    assert d["fixture"] is True and d["system_fingerprint"] == "fixture"
    assert d["choices"][0]["message"]["content"] == "one two three four"
    assert d["choices"][0]["finish_reason"] == "stop"
    assert d["usage"] == {"prompt_tokens": 4 + 3, "completion_tokens": 4, "total_tokens": 11}


def test_script_order_match_times_and_exhaustion():
    script = [answer("first", "1"), answer("judge", "J", match="DIAGNOSE", times=2), answer("second", "2")]
    with FakeOpenAIServer(script) as srv:
        got = []
        for user in ["hello", "please DIAGNOSE", "hello", "DIAGNOSE again", "DIAGNOSE thrice"]:
            status, _, body = chat(srv, user)
            got.append(json.loads(body)["model"] if status == 200 else status)
        # match only looks at the LAST user message
        status, _, body = post(srv.base_url + "/chat/completions", {"model": "m", "messages": [
            {"role": "user", "content": "DIAGNOSE"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "other"}]})
        assert [r.answered_with for r in srv.chat_requests()] == ["first", "judge", "second", "judge", None, None]
        assert srv.remaining() == []
    assert got == ["fixture-first", "fixture-judge", "fixture-second", "fixture-judge", 400]
    assert status == 400 and b"fixture script exhausted" in body


def test_unlimited_entry_and_recorded_requests():
    with FakeOpenAIServer([answer("always", "ok", times=0)]) as srv:
        for i in range(3):
            assert chat(srv, f"call {i}")[0] == 200
        reqs = srv.requests
    assert [r.body["messages"][-1]["content"] for r in reqs] == ["call 0", "call 1", "call 2"]
    assert all(r.method == "POST" and r.path == "/v1/chat/completions" for r in reqs)


def test_error_behaviours_on_the_wire():
    script = [rate_limit("busy", retry_after_s=2.5), server_error("boom", status=503), malformed("bad"),
              truncated("cut", "partial answer")]
    with FakeOpenAIServer(script) as srv:
        s1, h1, _ = chat(srv, "a")
        s2, h2, b2 = chat(srv, "b")
        s3, _, b3 = chat(srv, "c")
        s4, _, b4 = chat(srv, "d")
    assert s1 == 429 and h1["retry-after"] == "3" and h1["retry-after-ms"] == "2500"
    assert s2 == 503 and h2["x-cuco-fixture"] == "true" and json.loads(b2)["error"]["fixture"] is True
    assert s3 == 200
    with pytest.raises(ValueError):
        json.loads(b3)
    d4 = json.loads(b4)
    assert s4 == 200 and d4["choices"][0]["finish_reason"] == "length"
    assert d4["choices"][0]["message"]["content"] == "partial answer"


def test_delay_answers_late_and_stop_does_not_wait_for_a_sleeping_handler(no_stray_threads):
    srv = FakeOpenAIServer([slow("late", "eventually", delay_s=0.3), slow("never", "x", delay_s=60)]).start()
    t0 = time.monotonic()
    status, _, body = chat(srv, "a")
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "eventually"
    assert time.monotonic() - t0 >= 0.3
    errors: list[BaseException] = []

    def hang() -> None:
        try:
            chat(srv, "b")
        except BaseException as e:  # noqa: BLE001 - the server drops the connection on stop: any error ends the thread
            errors.append(e)

    t = threading.Thread(target=hang)
    t.start()
    deadline = time.monotonic() + 5
    while len(srv.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 3
    t.join(timeout=5)
    assert not t.is_alive()


def test_embeddings_float_and_base64_are_deterministic_unit_vectors():
    with FakeOpenAIServer(embedding_dim=32) as srv:
        s, _, b = post(srv.base_url + "/embeddings", {"model": "m", "input": ["alpha beta", "gamma"]})
        s64, _, b64 = post(srv.base_url + "/embeddings",
                           {"model": "m", "input": "alpha beta", "encoding_format": "base64"})
        assert srv.chat_requests() == []
    assert s == 200 and s64 == 200
    d = json.loads(b)
    v0, v1 = (row["embedding"] for row in d["data"])
    assert len(v0) == 32 and math.isclose(sum(x * x for x in v0), 1.0, rel_tol=1e-9)
    assert v0 != v1
    assert v0 == hashed_embedding("alpha beta", 32) == hashed_embedding("Alpha, BETA!", 32)
    raw = base64.b64decode(json.loads(b64)["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(decoded, v0))
    assert d["model"] == "fixture-embeddings" and d["usage"]["prompt_tokens"] == 3


def test_hashed_embeddings_put_texts_sharing_words_closer():
    a = hashed_embedding("split the allgather into chunks and overlap with gemm", 256)
    b = hashed_embedding("split the allgather into chunks and overlap with the gemm tiles", 256)
    c = hashed_embedding("persistent kernel with flags per source block", 256)

    def dot(x: list[float], y: list[float]) -> float:
        return sum(p * q for p, q in zip(x, y))

    assert dot(a, b) > dot(a, c)


def test_bad_requests_are_rejected_with_400():
    with FakeOpenAIServer([answer("a", "x")]) as srv:
        assert post(srv.base_url + "/chat/completions", {"model": "m"})[0] == 400
        assert post(srv.base_url + "/chat/completions",
                    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})[0] == 400
        assert post(srv.base_url + "/nope", {})[0] == 404
        # the scripted answer was not consumed by the bad requests
        assert [e.name for e in srv.remaining()] == ["a"]


def test_script_from_file_and_validation(tmp_path):
    p = tmp_path / "script.json"
    p.write_text(json.dumps([{"name": "a", "text": "hello"}, {"name": "b", "kind": "rate_limit",
                                                              "retry_after_s": 0.1}]))
    srv = FakeOpenAIServer.from_file(p)
    assert [(e.name, e.kind) for e in srv.script] == [("a", "text"), ("b", "rate_limit")]
    with pytest.raises(ValueError, match="kind"):
        Scripted("x", kind="explode")
    with pytest.raises(ValueError, match="unknown keys"):
        Scripted.from_dict({"name": "x", "txt": "typo"})
    with pytest.raises(ValueError, match="5xx"):
        server_error("x", status=404)
    with pytest.raises(RuntimeError, match="not started"):
        _ = FakeOpenAIServer().base_url
