"""GPU sets: which GPUs each evaluation slot of a host gets.

A world of W ranks under ``nccl`` needs W GPUs that reach each other over NVLink (one NVLink domain); under
``symm`` all ranks share one GPU. So a host's GPUs are split into NVLink domains (``nvidia-smi topo -p2p n``:
GPUs whose peer-to-peer status is OK are linked; a machine whose topology cannot be read counts as one domain) and
each domain into sets of W GPUs (``nccl``) or single GPUs (``symm``). GPUs left over are idle, and ``plan`` says
so. Standard library only: the parent never creates a CUDA context.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from cuco_kit.errors import BadInput


@dataclass(frozen=True)
class GpuSet:
    """The GPUs of one slot, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs)."""

    slot: int
    gpus: tuple[str, ...]

    @property
    def visible_devices(self) -> str:
        return ",".join(self.gpus)

    @property
    def label(self) -> str:
        return f"slot {self.slot} [GPU {self.visible_devices}]"


@dataclass
class GpuPlan:
    sets: list[GpuSet]
    idle: list[str]  # GPUs no set uses (a domain's remainder)
    note: str = ""  # how the domains were found


def parse_gpu_list(text: str) -> list[str]:
    """"0,1,2,3" -> ["0", "1", "2", "3"]; refuses an empty list or a GPU named twice."""
    gpus = [g.strip() for g in text.split(",") if g.strip()]
    if not gpus:
        raise BadInput(f"--gpus {text!r}: name at least one GPU, e.g. --gpus 0,1,2,3")
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise BadInput(f"--gpus {text!r}: GPU {', '.join(twice)} is named twice; name each GPU once")
    return gpus


def parse_p2p_matrix(text: str) -> dict[str, set[str]]:
    """The NVLink neighbours of each GPU (by index) from ``nvidia-smi topo -p2p n``: a header of column names
    ("GPU0 GPU1 ..."), then one row per GPU ("GPU0 X OK NS ..."); OK means peer-to-peer over NVLink."""
    gpu = re.compile(r"GPU(\d+)")
    columns: list[str] = []
    links: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if not cells or not gpu.fullmatch(cells[0]):
            continue
        if all(gpu.fullmatch(c) for c in cells):
            columns = [c[3:] for c in cells]
            continue
        me = cells[0][3:]
        links[me] = {other for other, status in zip(columns, cells[1:]) if status == "OK" and other != me}
    return links


def nvlink_domains(gpus: Sequence[str], matrix: str | None = None) -> tuple[list[list[str]], str]:
    """``gpus`` grouped into NVLink domains (connected by peer-to-peer OK), and a note on how. ``matrix``:
    nvidia-smi's output (read from nvidia-smi when None); without one, all GPUs form one domain."""
    if matrix is None:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            try:
                p = subprocess.run([exe, "topo", "-p2p", "n"], capture_output=True, text=True, timeout=20)
                matrix = p.stdout if p.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                matrix = None
    links = parse_p2p_matrix(matrix) if matrix else {}
    if not links or any(g not in links for g in gpus):
        return [list(gpus)], "NVLink topology not read (no nvidia-smi topology for these GPUs): one domain"
    domains: list[list[str]] = []
    seen: set[str] = set()
    for g in gpus:
        if g in seen:
            continue
        todo, dom = [g], []
        while todo:
            x = todo.pop()
            if x in seen or x not in gpus:
                continue
            seen.add(x)
            dom.append(x)
            todo.extend(links[x])
        domains.append([x for x in gpus if x in dom])
    return domains, f"{len(domains)} NVLink domain(s) from nvidia-smi topo -p2p n"


def plan(gpus: Sequence[str], world_size: int, backend: str, *, matrix: str | None = None) -> GpuPlan:
    """Split ``gpus`` into slots: W GPUs of one NVLink domain each under ``nccl``, one GPU each under ``symm``.
    Raises BadInput (one line) when not one slot can be formed."""
    if backend == "symm" or world_size == 1:
        return GpuPlan([GpuSet(i, (g,)) for i, g in enumerate(gpus)], [], "one GPU per slot")
    domains, note = nvlink_domains(gpus, matrix)
    sets: list[GpuSet] = []
    idle: list[str] = []
    for dom in domains:
        n = len(dom) // world_size * world_size
        for k in range(0, n, world_size):
            sets.append(GpuSet(len(sets), tuple(dom[k:k + world_size])))
        idle.extend(dom[n:])
    if not sets:
        biggest = max(len(d) for d in domains)
        raise BadInput(f"a world of {world_size} ranks under nccl needs {world_size} GPUs of one NVLink domain; "
                       f"the largest domain among GPUs {','.join(gpus)} has {biggest} ({note}); use fewer --ranks "
                       "or --backend symm")
    return GpuPlan(sets, idle, note)
