"""Reading a text file the user named (a candidate, a seed, a workload's baseline, a plan or models file) as text,
with one clear line for anything that is not: missing, unreadable, huge, binary or not UTF-8.

Standard library only, so a command can check its files before importing anything heavy, and the GPU image,
which may lack tree-sitter, can use it too (`static_check.load_source` adds the CUDA checks on top).
"""
from __future__ import annotations

from pathlib import Path

from cuco_kit.errors import BadInput

# A source file larger than this is not a kernel someone wrote (the largest samples are tens of KiB).
MAX_SOURCE_BYTES = 16 << 20
# A JSON file the user writes by hand (a plan, a models file) is a few KiB.
MAX_JSON_BYTES = 1 << 20


def read_text(path: str | Path, what: str, *, kind: str, max_bytes: int) -> str:
    """The text of a file the user named; BadInput (one line naming it as ``what``) for a missing, unreadable,
    huge (over ``max_bytes``), binary or non-UTF-8 file. ``kind`` says what it should have been ("CUDA source")."""
    p = Path(path)
    try:
        if not p.exists():
            raise BadInput(f"{what} {p}: no such file")
        if not p.is_file():
            raise BadInput(f"{what} {p}: not a regular file")
        if p.stat().st_size > max_bytes:
            raise BadInput(f"{what} {p}: {p.stat().st_size} bytes is too large for {kind} "
                           f"(at most {max_bytes / 2**20:g} MiB)")
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"{what} {p}: cannot be read ({exc.strerror or exc})") from None
    if b"\x00" in data:
        raise BadInput(f"{what} {p}: is binary, not {kind}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} {p}: is not UTF-8 text (byte {exc.start}), not {kind}") from None


def read_source(path: str | Path, what: str = "candidate") -> str:
    """The text of a source file the user named (`read_text` for CUDA source). Only its bytes are checked, not
    that they are CUDA (`static_check.load_source` is)."""
    return read_text(path, what, kind="CUDA source", max_bytes=MAX_SOURCE_BYTES)
