"""Text embeddings through an OpenAI-compatible /embeddings endpoint (optional: the novelty filter works
offline without them). Same server, key, timeout and retry policy as the chat client (`LLMConfig`); the model
is `LLMConfig.embedding_model` ($CUCO_EMBEDDING_MODEL). Embedding calls are not put in the ledger: they are
cheap and carry no purpose; say so if you need them counted."""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from cuco_kit.llm.client import LLMError
from cuco_kit.llm.openai_client import LLMConfig, call_with_retries, make_openai


def embed(texts: Sequence[str], config: LLMConfig | None = None, *, batch_size: int = 64,
          sleep: Callable[[float], None] = time.sleep) -> list[list[float]]:
    """One vector per text, in the order given. Raises LLMUnavailable / LLMRequestRejected like the chat
    client."""
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise LLMError("embed() takes a sequence of strings")
    if not texts:
        return []
    if batch_size < 1:
        raise LLMError(f"batch_size must be >= 1, got {batch_size}")
    cfg = config if config is not None else LLMConfig()
    out: list[list[float]] = []
    rng = random.Random()
    with make_openai(cfg) as client:
        for lo in range(0, len(texts), batch_size):
            batch = texts[lo:lo + batch_size]

            def send(batch: list[str] = batch) -> list[list[float]]:
                # "float" explicitly: the SDK would ask for base64, which some local servers do not speak.
                resp = client.embeddings.create(model=cfg.embedding_model, input=batch, encoding_format="float")
                rows = sorted(resp.data, key=lambda d: d.index)
                if len(rows) != len(batch):
                    raise LLMError(f"the embeddings server returned {len(rows)} vectors for {len(batch)} texts")
                return [list(map(float, r.embedding)) for r in rows]

            vectors, _ = call_with_retries(send, cfg, what=f"embeddings ({cfg.embedding_model})", sleep=sleep,
                                           rng=rng)
            out.extend(vectors)
    return out
