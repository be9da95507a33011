"""The L0 static check: the sandbox policy a candidate's EVOLVE blocks must keep (docs/contracts.md, marker v2).

`check_candidate` rejects a candidate whose markers are malformed, whose frozen bytes differ from the parent's,
whose knobs are outside the knob block, outside their allowed sets or re-declared with another set than the
parent's, whose knob rules are malformed, broken by its knob values or not the parent's (`knob_rules`), or whose
host code inside blocks calls something outside the allow-list (found with tree-sitter; see `HOST_CALL_ALLOW` and
`HOST_CALL_DENY`). Code outside blocks is not checked: it is byte-identical to the
parent's, which a person accepted. The marker contract itself (blocks, knobs, frozen hash) is `cuco_kit.source.markers`.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco_kit.errors import BadInput
from cuco_kit.source import cuda_parse, knob_rules
from cuco_kit.source.markers import (
    MARKER_VERSION,
    Block,
    Knob,
    MarkerError,
    block_at,
    blocks,
    design_cell,
    frozen_hash,
    frozen_lines,
    scan_knobs,
)
from cuco_kit.source.source_file import read_source

_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*(include|include_next|import)\b")

# Share of a text tree-sitter may fail to parse before it is called "not CUDA". Heavy CUB headers stay under
# 0.2; Python, Markdown and TOML land above 0.25.
_MAX_ERROR_FRACTION = 0.25


@dataclass
class L0Report:
    """Verdict of the L0 static check. knobs are the candidate's (empty when they could not be read)."""

    ok: bool
    reasons: list[str]
    knobs: list[Knob] = field(default_factory=list)
    frozen_hash: str | None = None
    blocks: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)  # the knob rules' texts (empty when they could not be read)

    @property
    def knob_values(self) -> dict[str, str]:
        return {k.name: k.value for k in self.knobs}

    @property
    def cell(self) -> str:
        return design_cell(self.knobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reasons": list(self.reasons),
            "marker_version": MARKER_VERSION,
            "frozen_hash": self.frozen_hash,
            "blocks": list(self.blocks),
            "knobs": self.knob_values,
            "knob_sets": {k.name: list(k.allowed) for k in self.knobs},
            "knob_rules": list(self.rules),
            "cell": self.cell,
        }


# ------------------------------------------------------------------------------------------- host whitelist

# Denied in host code inside blocks, by category. The deny list wins over the allow-list (cudaGetDriverEntryPoint
# starts with "cuda" but is a dlsym).
HOST_CALL_DENY: dict[str, frozenset[str]] = {
    "file I/O": frozenset({
        "fopen", "fdopen", "freopen", "fclose", "fwrite", "fread", "fgets", "fgetc", "fscanf", "fseek", "ftell",
        "rewind", "tmpfile", "tmpnam", "mkstemp", "open", "openat", "creat", "close", "read", "write", "pread",
        "pwrite", "lseek", "unlink", "unlinkat", "remove", "rename", "mkdir", "rmdir", "chdir", "truncate",
        "ftruncate", "mmap", "munmap", "fsync", "opendir", "readdir", "symlink", "link", "chmod", "chown",
        "fprintf", "vfprintf", "fputs", "fputc", "fflush", "shm_open", "memfd_create"}),
    "process/syscall": frozenset({
        "system", "popen", "pclose", "fork", "vfork", "clone", "execl", "execlp", "execle", "execv", "execvp",
        "execvpe", "execve", "fexecve", "posix_spawn", "posix_spawnp", "syscall", "ptrace", "kill", "raise",
        "signal", "sigaction", "abort", "exit", "_exit", "_Exit", "quick_exit", "atexit", "setuid", "setgid",
        "ioctl", "prctl", "dup", "dup2", "pipe", "socket", "connect", "bind", "listen", "accept", "send",
        "recv", "sendto", "recvfrom", "sendmsg", "recvmsg", "getaddrinfo", "gethostbyname"}),
    "dynamic loading": frozenset({
        "dlopen", "dlsym", "dlvsym", "dlclose", "dladdr", "dlmopen", "cudaGetDriverEntryPoint",
        "cudaGetDriverEntryPointByVersion", "cuGetProcAddress"}),
    "environment": frozenset({"getenv", "secure_getenv", "setenv", "unsetenv", "putenv", "clearenv"}),
    "threads": frozenset({
        "pthread_create", "pthread_detach", "pthread_join", "pthread_kill", "pthread_cancel", "thrd_create",
        "thread", "jthread", "async"}),
}
_DENY_CATEGORY = {name: cat for cat, names in HOST_CALL_DENY.items() for name in names}

# Names denied wherever they appear in a block (host or device, called or only referenced): taking the address
# of one of these is as bad as calling it. Common words (read, write, send, signal, kill) are left out so that
# variables with those names stay legal.
DENY_ANYWHERE = frozenset({
    "fopen", "freopen", "popen", "system", "fork", "vfork", "execl", "execlp", "execle", "execv", "execvp",
    "execvpe", "execve", "posix_spawn", "posix_spawnp", "syscall", "dlopen", "dlsym", "dlvsym", "dlmopen",
    "getenv", "secure_getenv", "setenv", "unsetenv", "putenv", "pthread_create", "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPointByVersion", "cuGetProcAddress"})

# Types whose use inside a block is file I/O or a thread.
DENY_TYPES: dict[str, str] = {
    "ifstream": "file I/O", "ofstream": "file I/O", "fstream": "file I/O", "basic_ifstream": "file I/O",
    "basic_ofstream": "file I/O", "basic_fstream": "file I/O", "filebuf": "file I/O", "thread": "threads",
    "jthread": "threads", "pthread_t": "threads"}
DENY_NAMESPACES: dict[str, str] = {"filesystem": "file I/O", "this_thread": "threads"}

# What host code inside blocks may call, besides kernel launches, member calls (obj.f(), p->f(): the object's
# type is checked where it is declared), immediately invoked lambdas, and functions, macros and types defined in
# the same file (their bodies are frozen, so accepted before, or inside a block, so checked here).
# Extend these, or pass extra_allow to check_candidate, when a safe call is rejected as unknown.
HOST_CALL_ALLOW_PREFIXES: tuple[str, ...] = (
    "cuda", "cublas", "nccl", "cuco_", "CUCO_", "CUDA_", "NCCL_", "CUBLAS_", "make_", "nvtx", "cub::",
    "cuda::", "std::numeric_limits::")
HOST_CALL_ALLOW: frozenset[str] = frozenset({
    # casts and constructors of builtin and CUDA types
    "static_cast", "reinterpret_cast", "const_cast", "dynamic_cast", "bit_cast", "dim3", "size_t", "int8_t",
    "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "intptr_t", "uintptr_t",
    "ptrdiff_t", "char", "short", "int", "long", "unsigned", "signed", "float", "double", "bool", "half",
    "__half", "__nv_bfloat16", "__nv_fp8_e4m3", "float2", "float4", "int2", "int4", "uint2", "uint4",
    "__float2half", "__half2float", "__float2bfloat16", "__bfloat162float",
    # C library: memory, strings, maths, printing to the console (nothing a candidate prints is read)
    "memset", "memcpy", "memmove", "memcmp", "malloc", "calloc", "realloc", "free", "aligned_alloc",
    "posix_memalign", "strlen", "strcmp", "strncmp", "strcpy", "strncpy", "snprintf", "sprintf", "printf",
    "puts", "assert", "min", "max", "abs", "fabs", "fabsf", "fminf", "fmaxf", "fmin", "fmax", "ceil", "floor",
    "ceilf", "floorf", "sqrt", "sqrtf", "exp", "expf", "log", "logf", "log2", "log2f", "pow", "powf", "round",
    "lround",
    # C++ standard library without I/O
    "std::min", "std::max", "std::clamp", "std::swap", "std::abs", "std::fill", "std::fill_n", "std::copy",
    "std::copy_n", "std::memcpy", "std::memset", "std::size", "std::data", "std::begin", "std::end",
    "std::move", "std::forward", "std::accumulate", "std::iota", "std::sort", "std::max_element",
    "std::min_element", "std::ceil", "std::floor", "std::sqrt", "std::log2", "std::pow", "std::exp",
    "std::make_pair", "std::make_tuple", "std::tie", "std::get", "std::pair", "std::tuple", "std::array",
    "std::vector", "std::unique_ptr", "std::make_unique", "std::to_string", "std::printf", "std::snprintf",
    "std::gcd", "std::lcm", "std::has_single_bit", "std::bit_ceil", "std::bit_floor", "std::countr_zero",
    "std::is_same_v", "std::declval", "std::addressof"})

# fprintf and friends are allowed when they write to the console, not to a file.
_CONSOLE_STREAM_ARG = {"fprintf": 0, "vfprintf": 0, "fflush": 0, "fputs": -1, "fputc": -1}
_CONSOLE_STREAMS = frozenset({"stderr", "stdout"})


def _defined_names(tree: cuda_parse.Tree) -> set[str]:
    """Functions, lambdas bound to names, types and macros defined in the file (qualified and last part)."""
    names: set[str] = set()

    def add(text: str) -> None:
        text = cuda_parse.strip_templates(text)
        if text:
            names.add(text)
            names.add(text.split("::")[-1])

    for node in cuda_parse.walk(tree.root_node):
        t = node.type
        if t == "function_definition":
            add(cuda_parse.function_name(node))
        elif t in ("struct_specifier", "class_specifier", "union_specifier", "enum_specifier") and \
                node.child_by_field_name("body") is not None:
            name = node.child_by_field_name("name")
            if name is not None:
                add(cuda_parse.node_text(name))
        elif t in ("preproc_def", "preproc_function_def", "alias_declaration", "type_definition"):
            name = node.child_by_field_name("name") or node.child_by_field_name("declarator")
            if name is not None:
                add(cuda_parse.node_text(name))
        elif t == "init_declarator":
            value = node.child_by_field_name("value")
            decl = node.child_by_field_name("declarator")
            if value is not None and value.type == "lambda_expression" and decl is not None:
                add(cuda_parse.node_text(decl))
    return names


def _console_stream_ok(call: cuda_parse.Call) -> bool:
    pos = _CONSOLE_STREAM_ARG.get(call.name.split("::")[-1])
    if pos is None:
        return False
    args_node = call.node.child_by_field_name("arguments")
    args = [c for c in args_node.named_children if c.type != "comment"] if args_node is not None else []
    return bool(args) and cuda_parse.node_text(args[pos]).strip() in _CONSOLE_STREAMS


def _call_allowed(name: str, defined: set[str], extra: frozenset[str]) -> bool:
    bare = name.lstrip(":")
    if bare in HOST_CALL_ALLOW or bare in extra or bare in defined:
        return True
    return bare.startswith(HOST_CALL_ALLOW_PREFIXES) or any(
        bare.startswith(p[:-1]) for p in extra if p.endswith("*"))


def _deny_category(name: str) -> str | None:
    bare = name.lstrip(":")
    if bare in _DENY_CATEGORY:
        return _DENY_CATEGORY[bare]
    last = bare.split("::")[-1]
    # std::system, ::getenv, std::thread(...) are the same thing under another spelling.
    if last in _DENY_CATEGORY and (bare.startswith("std::") or "::" not in bare):
        return _DENY_CATEGORY[last]
    return None


_WORD_RE = re.compile(r"[A-Za-z_]\w*")


def whitelist_problems(code: str, blks: list[Block], extra_allow: Iterable[str] = ()) -> list[str]:
    """One problem line per forbidden or unknown thing in host code inside the blocks `blks` of `code`."""
    if not blks:
        return []
    extra = frozenset(extra_allow)
    problems: dict[tuple[int, str], str] = {}

    def report(line: int, key: str, message: str) -> None:
        problems.setdefault((line, key), f"line {line}: {message}")

    lines = code.split("\n")
    for b in blks:
        for no in range(b.start_line + 1, b.end_line):
            if _INCLUDE_RE.match(lines[no - 1]):
                report(no, "#include", f"#include inside EVOLVE block {b.name!r}; includes belong in the frozen "
                                       "code")

    tree = cuda_parse.parse(code)
    defined = _defined_names(tree)
    dev_macros = cuda_parse.device_macros(tree)
    for call in cuda_parse.iter_calls(tree):
        blk = block_at(blks, call.line)
        if blk is None or call.device or call.kind in ("launch", "lambda", "member"):
            continue
        where = f"in host code inside EVOLVE block {blk.name!r}"
        if call.kind == "indirect":
            report(call.line, call.name, f"indirect call {call.name!r} {where}: L0 cannot tell what it calls; "
                                         "call a named function")
            continue
        category = _deny_category(call.name)
        if category is not None:
            if _console_stream_ok(call):
                continue
            report(call.line, call.name.split("::")[-1], f"{category} call {call.name!r} {where} is not allowed")
        elif not _call_allowed(call.name, defined, extra):
            report(call.line, call.name, f"unknown host call {call.name!r} {where}: not on the L0 allow-list (a "
                                         "person may add it to cuco_kit.source.static_check.HOST_CALL_ALLOW if it "
                                         "is safe)")

    for node in cuda_parse.walk(tree.root_node):
        line = node.start_point.row + 1
        blk = block_at(blks, line)
        if blk is None:
            continue
        t = node.type
        text = cuda_parse.node_text(node)
        if t == "identifier" and text in DENY_ANYWHERE:
            report(line, text, f"{_DENY_CATEGORY[text]}: {text!r} is referenced inside EVOLVE block "
                               f"{blk.name!r}, which is not allowed")
        elif t == "type_identifier" and text in DENY_TYPES:
            report(line, text, f"{DENY_TYPES[text]}: type {text!r} is used inside EVOLVE block {blk.name!r}, "
                               "which is not allowed")
        elif t == "namespace_identifier" and text in DENY_NAMESPACES:
            report(line, text, f"{DENY_NAMESPACES[text]}: namespace {text!r} is used inside EVOLVE block "
                               f"{blk.name!r}, which is not allowed")
        elif t == "gnu_asm_expression" and not cuda_parse.is_device_code(node, dev_macros):
            fn = cuda_parse.enclosing_function(node)
            owner = f"host function {cuda_parse.function_name(fn)!r}" if fn is not None else "file-scope code"
            report(line, "asm", f"inline asm in {owner} inside EVOLVE block {blk.name!r}; asm is allowed only "
                                "in __device__/__global__ code")
        elif t in ("preproc_def", "preproc_function_def"):
            # Macro bodies are raw text to tree-sitter, so check their words: a block must not hide a denied
            # call in a macro that frozen code expands.
            value = node.child_by_field_name("value")
            name = node.child_by_field_name("name")
            for word in _WORD_RE.findall(cuda_parse.node_text(value) if value is not None else ""):
                cat = _DENY_CATEGORY.get(word) or DENY_TYPES.get(word) or DENY_NAMESPACES.get(word) or (
                    "inline asm" if word in ("asm", "__asm__", "__asm") else None)
                if cat is not None:
                    report(line, word, f"{cat}: macro {cuda_parse.node_text(name) if name else '?'} uses "
                                       f"{word!r} inside EVOLVE block {blk.name!r}, which is not allowed")
        elif t == "ERROR" and not cuda_parse.is_device_code(node, dev_macros):
            # Code tree-sitter could not parse may still hide a call: check its words against the deny list.
            for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", text):
                word = m.group(1)
                if word in _DENY_CATEGORY:
                    report(line, word, f"{_DENY_CATEGORY[word]} call {word!r} in host code inside EVOLVE block "
                                       f"{blk.name!r} is not allowed")
                elif word in ("asm", "__asm__", "__asm"):
                    report(line, "asm", f"inline asm in host code inside EVOLVE block {blk.name!r}; asm is "
                                        "allowed only in __device__/__global__ code")
    return [problems[k] for k in sorted(problems, key=lambda k: k[0])]


# ------------------------------------------------------------------------------------------------------- L0

def source_problem(code: str) -> str | None:
    """Why `code` is not CUDA source (None when it looks like CUDA/C++)."""
    if not code.strip():
        return "is empty"
    if "\x00" in code:
        return "is binary, not CUDA source"
    if ";" not in code:
        return "does not look like CUDA source (no ';' anywhere)"
    frac = cuda_parse.error_fraction(cuda_parse.parse(code))
    if frac > _MAX_ERROR_FRACTION:
        return f"does not look like CUDA source (tree-sitter-cuda cannot parse {frac:.0%} of it)"
    return None


def _clip(text: str, n: int = 70) -> str:
    text = text.strip()
    return repr(text if len(text) <= n else text[:n] + "...")


def _frozen_diff(code: str, blks: list[Block], parent: str, pblks: list[Block], limit: int = 5) -> list[str]:
    mine, theirs = frozen_lines(code, blks), frozen_lines(parent, pblks)
    sm = difflib.SequenceMatcher(a=[t for _, t in theirs], b=[t for _, t in mine], autojunk=False)
    out: list[str] = []
    hunks = [op for op in sm.get_opcodes() if op[0] != "equal"]
    for tag, i1, _i2, j1, _j2 in hunks[:limit]:
        cline = mine[j1][0] if j1 < len(mine) else (mine[-1][0] if mine else 1)
        pline = theirs[i1][0] if i1 < len(theirs) else (theirs[-1][0] if theirs else 1)
        if tag == "replace":
            what = f"parent line {pline} {_clip(theirs[i1][1])} became {_clip(mine[j1][1])}"
        elif tag == "delete":
            what = f"parent line {pline} {_clip(theirs[i1][1])} was removed"
        else:
            what = f"{_clip(mine[j1][1])} was added"
        out.append(f"line {cline}: frozen code (outside EVOLVE blocks) differs from the parent: {what}")
    if len(hunks) > limit:
        out.append(f"... and {len(hunks) - limit} more changes to frozen code")
    return out


def _knob_set_problems(mine: list[Knob], theirs: list[Knob]) -> list[str]:
    """A candidate may change knob values, not the design space: names, types and sets must be the parent's."""
    out: list[str] = []
    pk = {k.name: k for k in theirs}
    ck = {k.name: k for k in mine}
    for k in mine:
        p = pk.get(k.name)
        if p is None:
            out.append(f"line {k.line}: knob {k.name} is new; the parent's knobs are "
                       f"{', '.join(pk) or '(none)'} and only their values may change")
        elif p.allowed != k.allowed or p.type != k.type:
            out.append(f"line {k.line}: knob {k.name} changed its type or allowed set (parent: {p.type} "
                       f"{p.spec}); only its value may change")
    for name, p in pk.items():
        if name not in ck:
            out.append(f"parent line {p.line}: knob {name} was removed; only knob values may change")
    return out


def check_candidate(code: str, parent_code: str | None = None, *, extra_allow: Iterable[str] = ()) -> L0Report:
    """The L0 static check of `code` against `parent_code` (frozen bytes and knob sets are compared only when a
    parent is given). A malformed candidate is a rejection; a malformed parent raises BadInput. extra_allow:
    more host calls to allow inside blocks (exact names, or prefixes ending in '*')."""
    problem = source_problem(code)
    if problem is not None:
        return L0Report(False, [f"candidate {problem}"])
    try:
        blks = blocks(code)
    except MarkerError as exc:
        return L0Report(False, [f"markers: {exc}"])
    reasons: list[str] = []
    cand_knobs, knob_problems = scan_knobs(code, blks)
    # Rules read the knobs: with a broken knob block they would only repeat its problems under other names.
    cand_rules, rule_problems = knob_rules.scan_rules(code, blks, cand_knobs) if not knob_problems else ([], [])
    fhash = frozen_hash(code)
    if parent_code is not None:
        try:
            pblks = blocks(parent_code)
        except MarkerError as exc:
            raise BadInput(f"parent: {exc}") from None
        if frozen_hash(parent_code) != fhash:
            reasons += _frozen_diff(code, blks, parent_code, pblks)
        parent_knobs, _ = scan_knobs(parent_code, pblks)
        if not knob_problems:
            reasons += _knob_set_problems(cand_knobs, parent_knobs)
            parent_rules, _ = knob_rules.scan_rules(parent_code, pblks, parent_knobs)
            if not rule_problems:
                reasons += knob_rules.rule_set_problems(cand_rules, parent_rules)
    reasons += knob_problems + rule_problems
    if not knob_problems and not rule_problems:
        reasons += knob_rules.violated(cand_rules, {k.name: k.value for k in cand_knobs})
    reasons += whitelist_problems(code, blks, extra_allow)
    return L0Report(not reasons, reasons, cand_knobs, fhash, [b.name for b in blks], [r.text for r in cand_rules])


# ---------------------------------------------------------------------------------------------- source files

def load_source(path: str | Path, what: str = "candidate") -> str:
    """Read a CUDA source file for the CLI; anything unusable raises BadInput with one line naming it."""
    p = Path(path)
    text = read_source(p, what)
    problem = source_problem(text)
    if problem is not None:
        raise BadInput(f"{what} {p}: {problem}")
    try:
        blocks(text)
    except MarkerError as exc:
        raise BadInput(f"{what} {p}: {exc}") from None
    return text
