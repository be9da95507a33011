"""A program's communication API type -- "lsa" (device-initiated load/store over NVLink), "gin" (device-initiated
one-sided puts over the network) or "host" (host collectives, or no communication at all) -- derived from its
source by the communication analyser (`cuco_kit.source.analysis`), never from what a proposal claims.

The type is a design dimension of the search: it enters the archive's cell (so GIN and LSA designs are elites of
cells of their own), and islands may be given one (`IslandConfig.api`) so each evolves designs of that API.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from cuco_kit.errors import BadInput

log = logging.getLogger("cuco_kit.search")

API_TYPES = ("lsa", "gin", "host")

# Used only where the analyser cannot run (tree-sitter missing, a parse failure): the same vocabulary it reads.
_GIN_TOKEN = re.compile(r"\bncclGin\w*")
_LSA_TOKEN = re.compile(r"\bncclLsa\w*|\bncclGetLsa\w*|\bncclTeamLsa\b"
                        r"|[\"<](?:lsa_compat|cuco_lsa|nccl_device)\.h[\">]")


@lru_cache(maxsize=512)
def program_features(code: str) -> dict[str, Any]:
    """Every analyser feature of ``code`` ({} where the analyser is not installed or fails). Cached by text:
    design-space children differ from their parent in knob values only, and parsing is the slow part."""
    try:
        from cuco_kit.source import analysis

        return dict(analysis.analyze(code).features())
    except Exception as exc:  # noqa: BLE001 - features refine the cell; their absence must not stop a search
        log.debug("analyzer features unavailable: %s", exc)
        return {}


def api_from_features(features: Mapping[str, Any]) -> str:
    """GIN wins over LSA (a GIN program usually reaches its LSA peers too); any other device-API use is LSA."""
    if features.get("uses_gin"):
        return "gin"
    if features.get("uses_lsa") or features.get("uses_device_api"):
        return "lsa"
    return "host"


def api_type(code: str) -> str:
    """The API type of a program's source: one of `API_TYPES`."""
    feats = program_features(code)
    if feats:
        return api_from_features(feats)
    if _GIN_TOKEN.search(code):
        return "gin"
    return "lsa" if _LSA_TOKEN.search(code) else "host"


def check_api(value: str, what: str) -> str:
    """``value`` if it is an API type or "" (any), else BadInput naming ``what``."""
    if value not in ("", *API_TYPES):
        raise BadInput(f"{what}: {value!r} is not an API type; use one of {', '.join(API_TYPES)} (or \"\" for any)")
    return value
