"""Secrets out of error text: every error the LLM layer raises, logs or stores goes through ``redact``.

A server may echo the request's key in an error (a 401 that quotes it, a proxy that dumps the headers), and error
text ends up in the ledger's store column, in logs and in notebook outputs. Two nets:
  - the exact API keys this process was configured with (``remember``; LLMConfig calls it for its key), whatever
    their shape (a local server's key can be any string);
  - the shapes of common credentials, whoever's they are: ``sk-...`` keys (OpenAI, Anthropic), Bearer/Basic
    authorization values, GitHub, GitLab, Hugging Face, Slack and Google keys, AWS access key ids, the
    user:password part of a URL, and ``api_key=...``-style assignments.
"""
from __future__ import annotations

import re
import threading

REDACTED = "[redacted]"
_MIN_KNOWN = 8  # shorter configured "keys" (dummies, tests) would redact ordinary words

_SHAPES = [re.compile(p) for p in (
    r"\bsk-[A-Za-z0-9_\-]{8,}",
    r"\b(?:[Bb]earer|BEARER|[Bb]asic|BASIC)\s+(?=[A-Za-z0-9._~+/=\-]*[0-9+/=])[A-Za-z0-9._~+/=\-]{8,}",
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
    r"\bglpat-[A-Za-z0-9_\-]{16,}",
    r"\bhf_[A-Za-z0-9]{20,}",
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    r"\bAIza[0-9A-Za-z_\-]{30,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",
)]
# name=value / "name": "value" for key-like names: the value goes, the name stays (it says what was there)
_ASSIGNED = re.compile(r"(?i)((?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
                       r"([^\s\"',;&}]{6,})")

_known: set[str] = set()
_lock = threading.Lock()


def remember(secret: str | None) -> None:
    """Redact this exact string from now on (a configured API key)."""
    if secret and len(secret) >= _MIN_KNOWN:
        with _lock:
            _known.add(secret)


def redact(text: str) -> str:
    """``text`` with every remembered secret and every credential-shaped substring replaced by [redacted]."""
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, REDACTED)
    for shape in _SHAPES:
        text = shape.sub(REDACTED, text)
    return _ASSIGNED.sub(lambda m: m.group(1) + REDACTED, text)
