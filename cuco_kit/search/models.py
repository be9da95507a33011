"""Which model does which job: per-role models for the search, each with its own settings and price.

Roles: ``mutation`` (one or more models; with several, a UCB bandit picks one per proposal, see bandit.py),
``meta`` (the three-step meta-summary), ``diagnosis`` (why an evaluation failed or was slower than its parent,
search/diagnosis.py), ``novelty_judge`` (asked whether a near-duplicate is new after all, search/novelty.py),
``novelty`` (the embedding model of the novelty filter, when it uses embeddings) and ``judge`` (kept in the run's
config for evaluation-side judges; the search itself asks none). A role left empty uses the first mutation model
(the embedding default for ``novelty``), so a cheap model can take the side roles while a strong one mutates.
With no model configured at all the search uses the one LLM client it is given, as before.

Per-model settings: the server (``base_url``, else $OPENAI_BASE_URL), the price ($ per million input and output
tokens; a model without one is never counted free, its tokens count against the token budget), whether a
temperature may be sent (OpenAI's reasoning models refuse it), the reasoning effort, and the context length
(answers are sized to fit next to the prompt).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.llm.client import LLMClient
from cuco_kit.llm.openai_client import LLMConfig, OpenAICompatibleClient

ROLES = ("mutation", "judge", "meta", "novelty", "diagnosis", "novelty_judge")
# Roles besides mutation that the search itself asks (each falls back to the first mutation model).
SIDE_ROLES = ("meta", "diagnosis", "novelty_judge")
REASONING_EFFORTS = ("low", "medium", "high")
# Completion tokens a reasoning model may spend thinking before it answers, by effort.
REASONING_TOKENS = {"low": 2048, "medium": 8192, "high": 24576}


@dataclass
class ModelSpec:
    name: str
    base_url: str | None = None  # None: $OPENAI_BASE_URL, else api.openai.com
    price: tuple[float, float] | None = None  # input, output $ per million tokens; None: the built-in table
    send_temperature: bool = True
    reasoning_effort: str | None = None
    context_tokens: int | None = None
    max_tokens_param: str = "max_tokens"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise BadInput(f"a model needs a name (a non-empty string), got {self.name!r}")
        for key in ("base_url", "reasoning_effort"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise BadInput(f"model {self.name}: {key} must be a string, got {getattr(self, key)!r}")
        if not isinstance(self.max_tokens_param, str) or not self.max_tokens_param:
            raise BadInput(f"model {self.name}: max_tokens_param must be a name, got {self.max_tokens_param!r}")
        if not isinstance(self.send_temperature, bool):
            raise BadInput(f"model {self.name}: send_temperature must be true or false, got "
                           f"{self.send_temperature!r}")
        if self.reasoning_effort is not None and self.reasoning_effort not in REASONING_EFFORTS:
            raise BadInput(f"model {self.name}: reasoning_effort {self.reasoning_effort!r} is not one of "
                           f"{', '.join(REASONING_EFFORTS)}")
        if self.price is not None:
            if not (isinstance(self.price, (list, tuple)) and len(self.price) == 2
                    and all(_number(v) for v in self.price)):
                raise BadInput(f"model {self.name}: price must be [input, output] dollars per million tokens, "
                               f"got {self.price!r}")
            self.price = (float(self.price[0]), float(self.price[1]))
            if min(self.price) < 0 or not all(math.isfinite(v) for v in self.price):
                raise BadInput(f"model {self.name}: prices must be finite and >= 0, got {self.price}")
        if self.context_tokens is not None and not (_integer(self.context_tokens) and self.context_tokens > 0):
            raise BadInput(f"model {self.name}: context_tokens must be a whole number > 0, got "
                           f"{self.context_tokens!r}")

    @property
    def reasoning_tokens(self) -> int:
        return REASONING_TOKENS.get(self.reasoning_effort or "", 0)

    def llm_config(self, base: LLMConfig | None = None) -> LLMConfig:
        """An LLMConfig for this model; timeouts and retries from ``base``."""
        b = base or LLMConfig()
        return LLMConfig(base_url=self.base_url or b.base_url, api_key=b.api_key, model=self.name,
                         timeout_s=b.timeout_s, max_retries=b.max_retries, backoff_base_s=b.backoff_base_s,
                         backoff_cap_s=b.backoff_cap_s, prices=self.prices(), max_tokens_param=self.max_tokens_param,
                         send_temperature=self.send_temperature, reasoning_effort=self.reasoning_effort,
                         context_tokens=self.context_tokens)

    def prices(self) -> dict[str, tuple[float, float]] | None:
        return {self.name: self.price} if self.price is not None else None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | str, *, strict: bool = False) -> ModelSpec:
        """A model from its name or its dict. ``strict`` (a file the user wrote): a key this code does not know is
        refused by name; otherwise (a stored run's config, maybe from a newer version) it is left out."""
        if isinstance(d, str):
            return cls(d)
        if not isinstance(d, dict) or "name" not in d:
            raise BadInput(f"a model is its name or an object with a 'name', not {d!r}")
        _refuse_unknown(d, cls.__dataclass_fields__, f"model {d.get('name', '?')}", strict)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass
class ModelsConfig:
    mutation: list[ModelSpec] = field(default_factory=list)
    judge: ModelSpec | None = None
    meta: ModelSpec | None = None
    novelty: ModelSpec | None = None
    diagnosis: ModelSpec | None = None
    novelty_judge: ModelSpec | None = None
    bandit_c: float = 0.5  # UCB exploration weight (0: always the best so far)

    def __post_init__(self) -> None:
        if not _number(self.bandit_c):
            raise BadInput(f"bandit_c must be a number, got {self.bandit_c!r}")
        names = [m.name for m in self.mutation]
        if len(set(names)) != len(names):
            raise BadInput(f"mutation models must have distinct names, got {names}")
        if self.bandit_c < 0:
            raise BadInput(f"bandit_c must be >= 0, got {self.bandit_c}")

    def for_role(self, role: str) -> ModelSpec | None:
        if role not in ROLES:
            raise BadInput(f"role {role!r} is not one of {', '.join(ROLES)}")
        if role == "mutation":
            return self.mutation[0] if self.mutation else None
        spec: ModelSpec | None = getattr(self, role)
        if spec is None and role != "novelty" and self.mutation:
            return self.mutation[0]
        return spec

    def prices(self) -> dict[str, tuple[float, float]]:
        """The configured prices of every model (for the ledger)."""
        out: dict[str, tuple[float, float]] = {}
        for m in [*self.mutation, self.judge, self.meta, self.novelty, self.diagnosis, self.novelty_judge]:
            if m is not None and m.price is not None:
                out[m.name] = m.price
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, strict: bool = False) -> ModelsConfig:
        """The config of ``d``. ``strict`` (a file the user wrote): a key this code does not know, here or in a
        model, is refused by name; otherwise (a stored run's config, maybe from a newer version) it is left out."""
        _refuse_unknown(d, cls.__dataclass_fields__, "models", strict)
        d = dict(d)
        mutation = d.get("mutation", [])
        if not isinstance(mutation, list):
            raise BadInput(f"'mutation' must be a list of models, got {mutation!r}")
        d["mutation"] = [ModelSpec.from_dict(m, strict=strict) for m in mutation]
        for role in ROLES[1:]:
            if d.get(role) is not None:
                d[role] = ModelSpec.from_dict(d[role], strict=strict)
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _refuse_unknown(d: dict[str, Any], known: Any, where: str, strict: bool) -> None:
    unknown = sorted(str(k) for k in d if k not in known)
    if strict and unknown:
        raise BadInput(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def make_clients(specs: list[ModelSpec], base: LLMConfig | None = None) -> dict[str, LLMClient]:
    """One OpenAI-compatible client per model (the openai package is imported when the first is made)."""
    return {s.name: OpenAICompatibleClient(s.llm_config(base)) for s in specs}
