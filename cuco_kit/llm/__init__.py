"""LLM access: a one-method client protocol, an OpenAI-compatible client, the ledger, record/replay."""
