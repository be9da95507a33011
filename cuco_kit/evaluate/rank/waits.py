"""The runtime's bounded waits, harness side (runtime/cuco_waits.h): the control block a loaded library's waits are
bound to, and the verdict naming what the wait that gave up waited on.

The record holds the address the wait polled, as the kernel saw it. The harness made every window a candidate's
flags can live in (the flag region, the workload's tensors, the scratch windows, host NCCL's staging window) and
holds every rank's mapping of each in this process, so the address says whose word it was and which one:
"user flag (peer 0, slot 3)". A wait that gave up has ended, and so has its kernel: the failure is the
candidate's, and the world of rank processes keeps serving.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cuco_kit.evaluate.rank import abi

# runtime/cuco_lsa.h: the flag words per rank the runtime keeps (candidates' flags start here)
CUCO_FLAGS_RESERVED = 4096
# runtime/host_nccl_compat.h: the staging window opens with flag words, one block of CUCO_MAX_RANKS words per kind
HOST_NCCL_FLAG_BYTES = 4096
HOST_NCCL_WORD_KINDS = ("collective barriers reached by rank {q}", "chunks rank {q} put in its slot",
                        "chunks rank {q} consumed")


class Mapped(Protocol):
    """A window as the backends make it (rank/backends.py Window): every rank's address of it in this process."""

    nbytes: int
    peers_host: list[int]


@dataclass(frozen=True)
class Region:
    """A window the harness made, by kind: "flags", "staging" (host NCCL), "tensor" or "scratch"."""

    kind: str
    name: str
    bases: tuple[int, ...]
    nbytes: int
    user_words: int = 0  # "flags": the words per rank a candidate sees; the harness's own barrier words follow

    def locate(self, addr: int) -> tuple[int, int] | None:
        """(peer, byte offset) of ``addr`` in this window, or None."""
        for peer, base in enumerate(self.bases):
            if base <= addr < base + self.nbytes:
                return peer, addr - base
        return None

    def word_name(self, peer: int, offset: int) -> str:
        if self.kind == "flags":
            word = offset // 8
            if word >= self.user_words:
                return f"the harness's barrier word {word - self.user_words} (peer {peer})"
            if word >= CUCO_FLAGS_RESERVED:
                return f"user flag (peer {peer}, slot {word - CUCO_FLAGS_RESERVED})"
            return f"runtime flag word {word} (peer {peer}; the first {CUCO_FLAGS_RESERVED} belong to the runtime)"
        if self.kind == "staging":
            if offset >= HOST_NCCL_FLAG_BYTES:
                return f"host NCCL staging byte {offset} (peer {peer})"
            which, q = divmod(offset // 8, abi.CUCO_MAX_RANKS)
            return f"host NCCL word: {HOST_NCCL_WORD_KINDS[which].format(q=q)} (peer {peer}'s staging window)"
        return f"a word of {self.kind} {self.name!r} (peer {peer}, byte {offset})"


def regions(flags: Mapped, user_words: int, tensors: Mapping[str, Mapped],
            scratch: Sequence[tuple[str, Mapped, int]], staging: Mapped | None) -> list[Region]:
    """The windows a wait's word can be in: the flag region (``user_words`` candidate-visible words per rank), the
    workload's tensors by name, the scratch windows as (declared name, window, declared bytes), host NCCL's
    staging window when this worker has one."""
    out = [Region("flags", "flags", tuple(flags.peers_host), flags.nbytes, user_words)]
    out += [Region("tensor", name, tuple(w.peers_host), w.nbytes) for name, w in tensors.items()]
    out += [Region("scratch", name, tuple(w.peers_host), size) for name, w, size in scratch]
    if staging is not None:
        out.append(Region("staging", "host_nccl_staging", tuple(staging.peers_host), staging.nbytes))
    return out


def reset(ctl: abi.CucoWaitCtl, limit_s: float) -> None:
    """A zeroed block of this layout, whose waits give up after ``limit_s`` (before every bind)."""
    ctypes.memset(ctypes.addressof(ctl), 0, ctypes.sizeof(ctl))
    ctl.version = abi.CUCO_WAITS_VERSION
    ctl.struct_size = ctypes.sizeof(abi.CucoWaitCtl)
    ctl.limit_ns = int(limit_s * 1e9)


def abort(ctl: abi.CucoWaitCtl) -> None:
    """Every bound wait gives up at its next look (the harness's watchdog fired)."""
    ctl.abort = 1


def waited_on(ctl: abi.CucoWaitCtl, where: Sequence[Region]) -> str:
    """What the wait that gave up waited on, named by kind and by the window its word is in."""
    if ctl.kind == abi.CUCO_WAIT_LSA_BARRIER:
        return f"LSA barrier {ctl.index} (peer {ctl.peer} never arrived)"
    if ctl.kind == abi.CUCO_WAIT_GIN_SIGNAL:
        return f"GIN signal {ctl.index}"
    if ctl.kind == abi.CUCO_WAIT_GIN_COUNTER:
        return f"GIN counter {ctl.index}"
    for region in where:
        found = region.locate(int(ctl.word))
        if found is not None:
            return region.word_name(*found)
    return f"a word at {int(ctl.word):#x} outside the harness's windows (the candidate's own memory)"


def verdict(ctl: abi.CucoWaitCtl, where: Sequence[Region], what: str) -> str:
    """'' while no wait gave up; else the failure, e.g. "timeout: waited on user flag (peer 0, slot 3) epoch 12
    for 2.0 s in verification trial 1/3 (it held 11; block 3,0,0 thread 0; the harness aborted it at the step
    limit)"."""
    if not ctl.gave_up:
        return ""
    value = "count" if ctl.kind in (abi.CUCO_WAIT_HOST_NCCL, abi.CUCO_WAIT_GIN_SIGNAL,
                                    abi.CUCO_WAIT_GIN_COUNTER) else "epoch"
    ended = ("the harness aborted it at the step limit" if ctl.ended_by == abi.CUCO_WAIT_ABORT else
             "the waits' limit, the step limit")
    block = ",".join(str(int(b)) for b in ctl.block)
    return (f"timeout: waited on {waited_on(ctl, where)} {value} {int(ctl.target)} for {ctl.waited_ns / 1e9:.1f} s "
            f"in {what} (it held {int(ctl.seen)}; block {block} thread {int(ctl.thread)}; {ended})")
