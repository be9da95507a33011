"""The model flags of `cuco search`: several mutation models (a UCB bandit picks one per proposal), per-role models
and per-model settings from a JSON file.

    --mutation-model gpt-5-mini --mutation-model gpt-4.1-mini      two mutation models, built-in prices
    --models models.json                                           a ModelsConfig: every role and setting
    --meta-model M --diagnosis-model M --novelty-judge-model M     a (cheap) model for a side role

models.json holds {"mutation": [{"name": ..., "price": [in, out], "send_temperature": false,
"reasoning_effort": "low", "context_tokens": 128000, "base_url": ...}, ...], "meta": {...}, "novelty": {...},
"diagnosis": {...}, "novelty_judge": {...}, "judge": {...}, "bandit_c": 0.5}; a model may also be given as its name
alone. A role flag overrides the file's model of that role. Not a command itself.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cuco_kit.errors import BadInput
from cuco_kit.search.config import SearchConfig
from cuco_kit.search.models import ModelsConfig, ModelSpec
from cuco_kit.source.source_file import MAX_JSON_BYTES, read_text

# Side roles with a flag of their own, and what each model does (the flags' help).
_ROLE_FLAGS = {"meta": "the meta-summary (summary, scratchpad, ranked recommendations)",
               "diagnosis": "the diagnoses of failed and slow evaluations",
               "novelty_judge": "the novelty judge (asked about near-duplicates when --novelty-judge is on)"}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("models")
    g.add_argument("--mutation-model", action="append", default=[], metavar="NAME",
                   help="a mutation model (repeat for several: a UCB bandit on improvement per dollar picks one per "
                        "proposal); default $CUCO_MODEL")
    g.add_argument("--models", type=Path, default=None, metavar="FILE.json",
                   help="per-role models and per-model settings (price, send_temperature, reasoning_effort, "
                        "context_tokens, base_url); see docs/llm_search.md")
    for role, what in _ROLE_FLAGS.items():
        g.add_argument(f"--{role.replace('_', '-')}-model", dest=f"{role}_model", default=None, metavar="NAME",
                       help=f"the model of {what} (default: the first mutation model)")
    g.add_argument("--novelty-judge", action="store_true",
                   help="ask the novelty judge model whether a near-duplicate (by similarity) is new after all "
                        "(off by default; each judgement counts against the LLM budget)")
    g.add_argument("--no-diagnosis", action="store_true",
                   help="ask no model why an evaluation failed or was slow (failures reach prompts as raw text)")


def models_from_args(args: argparse.Namespace) -> ModelsConfig:
    """The ModelsConfig the flags give (empty: the one model of $CUCO_MODEL). BadInput for a bad file."""
    models = ModelsConfig()
    if args.models is not None:
        text = read_text(args.models, "--models", kind="a JSON models file", max_bytes=MAX_JSON_BYTES)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"--models {args.models}: not JSON ({exc.msg} at line {exc.lineno})") from None
        except RecursionError:
            raise BadInput(f"--models {args.models}: nested too deeply to be a models file") from None
        if not isinstance(raw, dict):
            raise BadInput(f"--models {args.models}: must hold a JSON object with a 'mutation' list")
        try:
            models = ModelsConfig.from_dict(raw, strict=True)
        except (BadInput, TypeError, ValueError) as exc:
            raise BadInput(f"--models {args.models}: {exc}") from None
    if args.mutation_model:
        known = {m.name for m in models.mutation}
        models.mutation += [ModelSpec(n) for n in args.mutation_model if n not in known]
    for role in _ROLE_FLAGS:
        name = getattr(args, f"{role}_model", None)
        if name:
            setattr(models, role, ModelSpec(name))
    return models


def apply_role_switches(args: argparse.Namespace, config: SearchConfig) -> None:
    """The side roles' on/off flags, onto the run's config."""
    if getattr(args, "novelty_judge", False):
        config.novelty.llm_judge = True
    if getattr(args, "no_diagnosis", False):
        config.diagnosis.enabled = False
