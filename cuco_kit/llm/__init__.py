"""LLM access: a one-method client protocol, an OpenAI-compatible client, the ledger, record/replay.

Typical stack: `LedgeredClient(OpenAICompatibleClient(LLMConfig()), Ledger(store, run_id, budget_dollars=5))`;
wrap the inner client in `RecordingClient(..., path)` to record, or use `ReplayClient(path)` instead of it to
replay without a server. Nothing here imports `openai` at import time.
"""
from cuco_kit.llm.client import (
    Completion,
    LLMBudgetExceeded,
    LLMClient,
    LLMError,
    LLMReplayMiss,
    LLMRequestRejected,
    LLMTruncated,
    LLMUnavailable,
    request_hash,
)
from cuco_kit.llm.ledger import Ledger, LedgeredClient, LedgerEntry
from cuco_kit.llm.openai_client import LLMConfig, OpenAICompatibleClient
from cuco_kit.llm.replay import CallLog, RecordingClient, ReplayClient

__all__ = [
    "CallLog", "Completion", "LLMBudgetExceeded", "LLMClient", "LLMConfig", "LLMError", "LLMReplayMiss",
    "LLMRequestRejected", "LLMTruncated", "LLMUnavailable", "Ledger", "LedgerEntry", "LedgeredClient",
    "OpenAICompatibleClient", "RecordingClient", "ReplayClient", "request_hash",
]
