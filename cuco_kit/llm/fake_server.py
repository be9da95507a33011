"""A fake OpenAI-compatible HTTP server serving SCRIPTED answers, for tests and CUCO_SMOKE notebooks.

Everything it returns is labelled as a fixture: the response's model is "fixture-<entry name>", its
system_fingerprint is "fixture", the body carries "fixture": true and the headers `X-Cuco-Fixture: true` and
`X-Cuco-Fixture-Name`. It is real HTTP on 127.0.0.1 only (an ephemeral port; never another interface), run by
the stdlib http.server in a background thread, so the real `openai` client is exercised end to end.

    with FakeOpenAIServer([answer("stage-a", "```cuda ...```"), rate_limit("busy")]) as srv:
        client = OpenAICompatibleClient(srv.config())
        ...
        assert len(srv.chat_requests()) == 2

Script entries are used in order, except that an entry with `match` is used first for a request whose LAST
user message contains that substring (every one of them, for a list), and an entry with `absent` only for one
that does not contain it (a first attempt's answer is `absent` the retry prompt's wording). Each entry answers
`times` requests (0 = any number). When nothing in the script fits, the server answers HTTP 400 "fixture script
exhausted" (not retried, so a test fails fast).

Behaviours (`kind`): "text" (normal answer), "truncated" (finish_reason "length"), "rate_limit" (HTTP 429 with
Retry-After), "server_error" (HTTP `status`, 500 by default), "delay" (answers `text` after `delay_s`, for
client timeouts), "malformed" (HTTP 200 with a body that is not JSON), "unauthorized" (HTTP 401 whose body
echoes the request's API key and Authorization header in full, as a careless server or proxy would: for testing
that no key reaches a log or the store).

Usage tokens are APPROXIMATE: whitespace-separated words of all message contents (prompt) and of the answer
(completion), not a real tokenizer.

POST /v1/embeddings returns deterministic feature-hashed bag-of-words vectors (unit length, `embedding_dim`
floats), so texts sharing words are closer than unrelated ones; enough for the novelty filter's tests.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any

from cuco_kit.llm.openai_client import LLMConfig

log = logging.getLogger("cuco_kit.llm.fake_server")

KINDS = ("text", "truncated", "rate_limit", "server_error", "delay", "malformed", "unauthorized")
HOST = "127.0.0.1"


@dataclass
class Scripted:
    """One scripted answer (a fixture)."""

    name: str
    kind: str = "text"
    text: str = ""
    match: str | list[str] | None = None  # substring(s) of the last user message that select this entry
    absent: str | None = None  # a substring the last user message must not contain for this entry to answer
    times: int = 1  # requests it answers; 0 = unlimited
    status: int = 500  # for kind "server_error"
    retry_after_s: float = 1.0  # for kind "rate_limit"
    delay_s: float = 0.0  # for kind "delay"
    used: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fixture {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.times < 0:
            raise ValueError(f"fixture {self.name!r}: times must be >= 0")
        if self.kind == "server_error" and not 500 <= self.status <= 599:
            raise ValueError(f"fixture {self.name!r}: server_error status must be 5xx, got {self.status}")

    def fits(self, last_user: str) -> bool:
        """Whether this entry may answer a request whose last user message is `last_user`."""
        if self.absent is not None and self.absent in last_user:
            return False
        needles = [self.match] if isinstance(self.match, str) else list(self.match or [])
        return all(n in last_user for n in needles)

    @property
    def exhausted(self) -> bool:
        return self.times != 0 and self.used >= self.times

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scripted:
        known = {"name", "kind", "text", "match", "absent", "times", "status", "retry_after_s", "delay_s"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"fixture {d.get('name')!r}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)


def answer(name: str, text: str, *, match: str | list[str] | None = None, times: int = 1,
           absent: str | None = None) -> Scripted:
    return Scripted(name, "text", text, match, absent, times)


def truncated(name: str, text: str, *, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "truncated", text, match, times=times)


def rate_limit(name: str, *, retry_after_s: float = 1.0, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "rate_limit", match=match, times=times, retry_after_s=retry_after_s)


def server_error(name: str, *, status: int = 500, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "server_error", match=match, times=times, status=status)


def slow(name: str, text: str, *, delay_s: float, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "delay", text, match, times=times, delay_s=delay_s)


def malformed(name: str, *, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "malformed", match=match, times=times)


def unauthorized(name: str, *, match: str | None = None, times: int = 1) -> Scripted:
    return Scripted(name, "unauthorized", match=match, times=times)


def pick(script: list[Scripted], last_user: str) -> Scripted | None:
    """The entry that answers a request whose last user message is ``last_user`` (counted as used): the first
    live entry whose ``match`` it contains, else the first live entry without one; None when none is left."""
    live = [e for e in script if not e.exhausted and e.fits(last_user)]
    entry = next((e for e in live if e.match is not None), None)
    if entry is None:
        entry = next((e for e in live if e.match is None), None)
    if entry is not None:
        entry.used += 1
    return entry


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it was not JSON
    answered_with: str | None  # the fixture's name; None for embeddings and errors
    at: float


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def approx_tokens(text: str) -> int:
    """Whitespace-separated words: an approximation of a token count, documented as such."""
    return len(text.split())


def hashed_embedding(text: str, dim: int = 64) -> list[float]:
    """Deterministic unit vector: each lower-cased word adds +-1 at a sha256-chosen coordinate."""
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        h = hashlib.sha256(word.encode("utf-8")).digest()
        vec[int.from_bytes(h[:4], "little") % dim] += 1.0 if h[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0.0:
        vec[0] = 1.0
        return vec
    return [v / norm for v in vec]


class _Server(ThreadingMixIn, HTTPServer):
    # Non-daemon handler threads that server_close() joins: stop() leaves no thread behind.
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = False
    fake: FakeOpenAIServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # HTTP/1.0: one request per connection, so a handler thread never idles on a kept-alive socket.
    protocol_version = "HTTP/1.0"
    timeout = 5.0  # a client that connects and sends nothing cannot hold stop() for long

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        log.debug("fake server: " + format, *args)

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Cuco-Fixture", "true")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout); nothing to do

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), headers)

    def _error(self, status: int, message: str, etype: str) -> None:
        self._json(status, {"error": {"message": message, "type": etype, "fixture": True}})

    def do_GET(self) -> None:  # stdlib name
        fake = self.server.fake
        fake._record(self, None, None)
        if self.path.rstrip("/") == "/v1/models":
            names = sorted({f"fixture-{e.name}" for e in fake.script})
            self._json(200, {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "fixture"}
                                                        for n in names]})
        else:
            self._error(404, f"fake server: no GET {self.path}", "not_found")

    def do_POST(self) -> None:  # stdlib name
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace")
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        path = self.path.rstrip("/")
        if path == "/v1/embeddings":
            fake._record(self, body, None)
            self._embeddings(body)
            return
        if path != "/v1/chat/completions":
            fake._record(self, body, None)
            self._error(404, f"fake server: no POST {self.path}", "not_found")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            fake._record(self, body, None)
            self._error(400, "fake server: body must be JSON with a 'messages' list", "invalid_request_error")
            return
        if body.get("stream"):
            fake._record(self, body, None)
            self._error(400, "fake server: streaming is not supported", "invalid_request_error")
            return
        messages = body["messages"]
        last_user = next((content_text(m.get("content")) for m in reversed(messages)
                          if isinstance(m, dict) and m.get("role") == "user"), "")
        entry = fake._pick(last_user)
        fake._record(self, body, entry.name if entry else None)
        if entry is None:
            self._error(400, f"fixture script exhausted: no scripted answer left for last user message "
                             f"{last_user[:80]!r}", "fixture_script_exhausted")
            return
        self._chat(entry, messages)

    def _chat(self, e: Scripted, messages: list[Any]) -> None:
        fake = self.server.fake
        name_header = {"X-Cuco-Fixture-Name": e.name}
        if e.kind == "rate_limit":
            self._send(429, json.dumps({"error": {"message": f"fixture {e.name}: rate limited",
                                                  "type": "rate_limit_error", "fixture": True}}).encode(),
                       {**name_header, "Retry-After": str(max(1, math.ceil(e.retry_after_s))),
                        "retry-after-ms": str(int(e.retry_after_s * 1000))})
            return
        if e.kind == "server_error":
            self._send(e.status, json.dumps({"error": {"message": f"fixture {e.name}: server error",
                                                       "type": "server_error", "fixture": True}}).encode(),
                       name_header)
            return
        if e.kind == "malformed":
            self._send(200, b'{"id": "chatcmpl-fixture", "choices": [{"message": ', name_header)
            return
        if e.kind == "unauthorized":
            auth = self.headers.get("Authorization", "")
            key = auth.split(" ", 1)[1] if " " in auth else auth
            self._send(401, json.dumps({"error": {
                "message": f"fixture {e.name}: Incorrect API key provided: {key}.", "type": "invalid_request_error",
                "code": "invalid_api_key", "authorization": auth, "fixture": True}}).encode(), name_header)
            return
        if e.kind == "delay" and fake._stopping.wait(e.delay_s):
            return  # stopping: drop the connection instead of holding stop() for the whole delay
        prompt = sum(approx_tokens(content_text(m.get("content"))) for m in messages if isinstance(m, dict))
        completion = approx_tokens(e.text)
        with fake._lock:
            fake._counter += 1
            n = fake._counter
        self._json(200, {
            "id": f"chatcmpl-fixture-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": f"fixture-{e.name}",
            "system_fingerprint": "fixture",
            "fixture": True,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": e.text},
                         "finish_reason": "length" if e.kind == "truncated" else "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }, name_header)

    def _embeddings(self, body: Any) -> None:
        fake = self.server.fake
        inputs = body.get("input") if isinstance(body, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            self._error(400, "fake server: embeddings 'input' must be a string or a list of strings",
                        "invalid_request_error")
            return
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(inputs):
            vec = hashed_embedding(text, fake.embedding_dim)
            emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = sum(approx_tokens(t) for t in inputs)
        self._json(200, {"object": "list", "data": data, "model": "fixture-embeddings", "fixture": True,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server on 127.0.0.1 (see the module doc). Use as a context manager, or
    call start() and stop()."""

    def __init__(self, script: list[Scripted] | None = None, *, embedding_dim: int = 64, port: int = 0) -> None:
        self.script: list[Scripted] = list(script or [])
        self.requested_port = port  # 0: an ephemeral port
        self.embedding_dim = embedding_dim
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._counter = 0
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> FakeOpenAIServer:
        """A server whose script is a JSON list of Scripted fields (name, kind, text, match, times, ...)."""
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(entries, list):
            raise ValueError(f"{path}: a fixture script is a JSON list of entries")
        return cls([Scripted.from_dict(d) for d in entries], **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _Server((HOST, self.requested_port), _Handler)
        httpd.fake = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"cuco-fake-openai-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping in a "delay" entry
        httpd.shutdown()
        httpd.server_close()  # joins the handler threads
        if thread is not None:
            thread.join(timeout=10)
        self._httpd = self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def address(self) -> tuple[str, int]:
        if self._httpd is None:
            raise RuntimeError("fake server not started: call start() or use it as a context manager")
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def env(self) -> dict[str, str]:
        """Environment variables that point the OpenAI-compatible client at this server."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "fixture-key", "CUCO_MODEL": "fixture"}

    def config(self, **overrides: Any) -> Any:
        """An LLMConfig for this server (model "fixture"); keyword arguments override its fields."""
        fields: dict[str, Any] = {"base_url": self.base_url, "api_key": "fixture-key", "model": "fixture"}
        fields.update(overrides)
        return LLMConfig(**fields)

    # -- script and log -------------------------------------------------------------------------------------
    def add(self, *entries: Scripted) -> None:
        with self._lock:
            self.script.extend(entries)

    def remaining(self) -> list[Scripted]:
        with self._lock:
            return [e for e in self.script if not e.exhausted]

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/") == "/v1/chat/completions"]

    def _pick(self, last_user: str) -> Scripted | None:
        with self._lock:
            return pick(self.script, last_user)

    def _record(self, handler: BaseHTTPRequestHandler, body: Any, answered_with: str | None) -> None:
        rec = RecordedRequest(method=handler.command, path=handler.path, headers=dict(handler.headers.items()),
                              body=body, answered_with=answered_with, at=time.time())
        with self._lock:
            self._requests.append(rec)
