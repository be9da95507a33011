"""Reading a source file the user named (a candidate, a seed, a workload's baseline) as text, with one clear line
for anything that is not: missing, unreadable, huge, binary or not UTF-8.

Standard library only, so a command can check its files before importing anything heavy, and the GPU image,
which may lack tree-sitter, can use it too (`static_check.load_source` adds the CUDA checks on top).
"""
from __future__ import annotations

from pathlib import Path

from cuco_kit.errors import BadInput

# A source file larger than this is not a kernel someone wrote (the largest samples are tens of KiB).
MAX_SOURCE_BYTES = 16 << 20


def read_source(path: str | Path, what: str = "candidate") -> str:
    """The text of a source file the user named; BadInput (one line naming it) for a missing, unreadable, huge,
    binary or non-UTF-8 file. Only its bytes are checked, not that they are CUDA (`static_check.load_source` is)."""
    p = Path(path)
    try:
        if not p.exists():
            raise BadInput(f"{what} {p}: no such file")
        if not p.is_file():
            raise BadInput(f"{what} {p}: not a regular file")
        if p.stat().st_size > MAX_SOURCE_BYTES:
            raise BadInput(f"{what} {p}: {p.stat().st_size} bytes is too large for a CUDA source "
                           f"(at most {MAX_SOURCE_BYTES >> 20} MiB)")
        data = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"{what} {p}: cannot be read ({exc.strerror or exc})") from None
    if b"\x00" in data:
        raise BadInput(f"{what} {p}: is binary, not CUDA source")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{what} {p}: is not UTF-8 text (byte {exc.start}), not CUDA source") from None
