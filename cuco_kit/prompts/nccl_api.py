"""NCCL device-API excerpts for the fast-path prompts: the declarations that matter for LSA / GIN code, quoted
from the INSTALLED headers (the nvidia-nccl wheel), so the model sees the signatures the compiler will check,
not ones remembered from another NCCL version.

Declarations are found with tree-sitter (NCCL's attribute macros such as ``NCCL_DEVICE_INLINE`` leave small
ERROR nodes, but function declarators, struct bodies, typedefs and aliases still come out whole). Each one is
quoted exactly as written, with the header and line it came from. Results are cached per header version
(``NCCL_VERSION_CODE``) in memory and, when the cache folder is writable, on disk.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cuco_kit.errors import CucoError
from cuco_kit.evaluate.build import _wheel_subdir, nccl_header_version, nccl_version_string
from cuco_kit.source import cuda_parse as cp

# Bump when the extraction changes, so stale disk caches are ignored.
EXTRACTOR_VERSION = 1

# Section -> names to quote. Order inside a section is the order the prompt shows them in.
SECTIONS: dict[str, tuple[str, ...]] = {
    "windows": ("ncclWindow_t", "NCCL_WIN_COLL_SYMMETRIC", "ncclCommWindowRegister", "ncclMemAlloc"),
    "devcomm": ("ncclDevComm", "ncclDevCommRequirements", "ncclDevCommCreate", "ncclDevCommDestroy", "ncclTeam",
                "ncclTeamTagLsa", "ncclTeamTagWorld", "ncclTeamLsa", "ncclTeamWorld"),
    "pointers": ("ncclGetLocalPointer", "ncclGetLsaPointer", "ncclGetPeerPointer"),
    "coop": ("ncclCoopTile", "ncclCoopThread", "ncclCoopWarp", "ncclCoopCta"),
    "lsa": ("ncclLsaBarrierSession",),
    "gin": ("ncclGinSignal_t", "ncclGinCounter_t", "ncclGin_None", "ncclGin_SignalAdd", "ncclGin_SignalInc",
            "ncclGin_CounterInc", "ncclGin", "ncclGin_BackendMask", "ncclGinBarrierSession"),
}
BACKEND_SECTIONS: dict[str, tuple[str, ...]] = {
    "lsa": ("windows", "devcomm", "pointers", "coop", "lsa"),
    "gin": ("windows", "devcomm", "pointers", "coop", "gin"),
}

_NAME_TOKEN = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Declaration:
    name: str
    kind: str  # struct, function, typedef, alias, macro
    header: str  # path relative to the include folder
    line: int  # 1-based
    text: str


def nccl_include_dir() -> Path:
    """The include folder of the installed nvidia-nccl wheel; CucoError when it is not installed."""
    d = _wheel_subdir("nccl", "include")
    if d is None or not (d / "nccl.h").is_file():
        raise CucoError("NCCL headers not found: install the nvidia-nccl-cu13 wheel (pip install -e '.[gpu]'), or "
                        "pass include_dir= to device_api_excerpts()")
    return d


def _headers(include_dir: Path) -> list[Path]:
    files = [include_dir / "nccl.h"]
    dev = include_dir / "nccl_device"
    if dev.is_dir():
        # Public headers and impl/*__types.h (ncclDevComm's fields live there); impl/*__funcs.h hold bodies,
        # not API.
        files += sorted(p for p in dev.rglob("*.h")
                        if "impl" not in p.relative_to(dev).parts or p.name.endswith("__types.h"))
    return [f for f in files if f.is_file()]


def _last_name(text: str) -> str | None:
    names = _NAME_TOKEN.findall(text)
    return names[-1] if names else None


def _declared(node: cp.Node) -> tuple[str, str] | None:
    """(name, kind) of a declaration node worth quoting, else None."""
    t = node.type
    if t in ("struct_specifier", "class_specifier", "enum_specifier"):
        body = node.child_by_field_name("body")
        name = node.child_by_field_name("name")
        # Empty tag structs ({}) count: ncclTeamTagLsa is used by value.
        if body is None or name is None:
            return None
        return cp.node_text(name), "struct"
    if t == "declaration":
        for sub in cp.walk(node):
            if sub.type == "function_declarator":
                decl = sub.child_by_field_name("declarator")
                ident = _last_name(cp.node_text(decl)) if decl is not None else None
                return (ident, "function") if ident else None
        return None
    if t == "type_definition":
        decl = node.child_by_field_name("declarator")
        ident = _last_name(cp.node_text(decl)) if decl is not None else None
        return (ident, "typedef") if ident else None
    if t == "alias_declaration":
        name = node.child_by_field_name("name")
        return (cp.node_text(name), "alias") if name is not None else None
    if t == "preproc_def":
        name = node.child_by_field_name("name")
        return (cp.node_text(name), "macro") if name is not None else None
    return None


def extract_declarations(include_dir: Path, names: Iterable[str]) -> list[Declaration]:
    """Every declaration of the given names in the public NCCL headers, in (header, line) order. A struct
    declared inside a template is quoted with its ``template<...>`` line."""
    wanted = set(names)
    out: list[Declaration] = []
    seen: set[tuple[str, int]] = set()
    for path in _headers(include_dir):
        data = path.read_bytes()
        tree = cp.parse(data)
        rel = str(path.relative_to(include_dir))
        for node in cp.walk(tree.root_node):
            found = _declared(node)
            if found is None or found[0] not in wanted:
                continue
            quoted = node.parent if node.parent is not None and node.parent.type == "template_declaration" \
                else node
            key = (rel, quoted.start_point[0])
            if key in seen:
                continue
            seen.add(key)
            text = data[quoted.start_byte:quoted.end_byte].decode("utf-8", errors="replace")
            if found[1] == "struct" and not text.rstrip().endswith(";"):
                text += ";"
            out.append(Declaration(found[0], found[1], rel, quoted.start_point[0] + 1, text.strip("\n")))
    return out


def _render(decls: Sequence[Declaration], sections: Sequence[str], version: int) -> str:
    by_name: dict[str, list[Declaration]] = {}
    for d in decls:
        by_name.setdefault(d.name, []).append(d)
    parts = [f"NCCL {nccl_version_string(version)} device API, quoted from the installed headers "
             "(the compiler checks against exactly these):"]
    for sec in sections:
        chunk: list[str] = []
        for name in SECTIONS[sec]:
            for d in by_name.get(name, []):
                chunk.append(f"// {d.header}:{d.line}\n{d.text}")
        if chunk:
            parts.append(f"### {sec}\n```cpp\n" + "\n\n".join(chunk) + "\n```")
    return "\n\n".join(parts) + "\n"


def _disk_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cuco" / "api_context"


@lru_cache(maxsize=16)
def _cached(include_dir: str, version: int, sections: tuple[str, ...], use_disk: bool) -> str:
    inc = Path(include_dir)
    digest = hashlib.sha256(f"{EXTRACTOR_VERSION}|{include_dir}|{','.join(sections)}".encode()).hexdigest()[:16]
    cache_file = _disk_cache_dir() / f"nccl-{version}-{digest}.md"
    if use_disk and cache_file.is_file():
        return cache_file.read_text(encoding="utf-8")
    names = [n for s in sections for n in SECTIONS[s]]
    text = _render(extract_declarations(inc, names), sections, version)
    if use_disk:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, cache_file)
        except OSError:
            pass  # a read-only home only costs a re-extraction next process
    return text


def device_api_excerpts(backend: str = "lsa", include_dir: str | Path | None = None, *,
                        sections: Sequence[str] | None = None, use_disk_cache: bool = True) -> str:
    """Markdown with the declarations a ``backend`` ("lsa" or "gin") rewrite needs, quoted from the headers."""
    if sections is None:
        if backend not in BACKEND_SECTIONS:
            raise CucoError(f"unknown backend {backend!r} for the API context; use one of "
                            f"{', '.join(BACKEND_SECTIONS)}")
        sections = BACKEND_SECTIONS[backend]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise CucoError(f"unknown API context section(s) {unknown}; known: {', '.join(SECTIONS)}")
    inc = Path(include_dir) if include_dir is not None else nccl_include_dir()
    return _cached(str(inc.resolve()), nccl_header_version(inc), tuple(sections), use_disk_cache)


def missing_declarations(backend: str = "lsa", include_dir: str | Path | None = None) -> list[str]:
    """Names of the backend's sections with no declaration in the headers (a header layout change: the prompt
    then lacks them, which is worth a warning)."""
    inc = Path(include_dir) if include_dir is not None else nccl_include_dir()
    names = [n for s in BACKEND_SECTIONS[backend] for n in SECTIONS[s]]
    found = {d.name for d in extract_declarations(inc, names)}
    return [n for n in names if n not in found]


__all__ = ["BACKEND_SECTIONS", "Declaration", "SECTIONS", "device_api_excerpts", "extract_declarations",
           "missing_declarations", "nccl_include_dir"]
