"""Collective machinery inside a rank worker: the `nccl` backend (ctypes on the wheel's libnccl.so.2) and the
`symm` backend (torch symmetric memory, several ranks on one GPU). Both hand out symmetric windows as
``Window`` objects with a local pointer, every peer's pointer (host list + device table) and a torch view.

Everything here is collective: every rank calls the same methods in the same order, and after each collective
phase the ranks exchange their status through the store (worker.Channel.exchange), so one failing rank makes
all of them fail the phase instead of hanging; the nccl communicator is then aborted.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

NCCL_SUCCESS = 0
NCCL_IN_PROGRESS = 7
NCCL_WIN_COLL_SYMMETRIC = 0x01
NCCL_CONFIG_UNDEF_INT = -(2**31)
NCCL_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
WINDOW_ALIGN = 4096  # NCCL_WIN_REQUIRED_ALIGNMENT; also the size granule of every window


def round_up(n: int, to: int = WINDOW_ALIGN) -> int:
    return max(to, (int(n) + to - 1) // to * to)


def nccl_library_path() -> Path:
    """The wheel's libnccl.so.2 (the same file torch loads by soname)."""
    try:
        import nvidia.nccl as pkg  # noqa: PLC0415 - optional wheel (nvidia-nccl-cu13): its absence is the error below

        for base in list(getattr(pkg, "__path__", [])):
            p = Path(base) / "lib" / "libnccl.so.2"
            if p.is_file():
                return p
    except ImportError:
        pass
    raise FileNotFoundError("libnccl.so.2 not found in the nvidia.nccl package; install nvidia-nccl-cu13")


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class NcclConfig(ctypes.Structure):
    """ncclConfig_v22800 (nccl.h 2.28): 'size, magic, version' then the user attributes."""

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int),
                ("trafficClass", ctypes.c_int), ("commName", ctypes.c_char_p), ("collnetEnable", ctypes.c_int),
                ("CTAPolicy", ctypes.c_int), ("shrinkShare", ctypes.c_int), ("nvlsCTAs", ctypes.c_int),
                ("nChannelsPerNetPeer", ctypes.c_int), ("nvlinkCentricSched", ctypes.c_int)]


def nccl_config(version_code: int, blocking: bool = False) -> NcclConfig:
    """NCCL_CONFIG_INITIALIZER with blocking set."""
    c = NcclConfig()
    c.size = ctypes.sizeof(NcclConfig)
    c.magic = 0xCAFEBEEF
    c.version = version_code
    for name, typ, *_ in NcclConfig._fields_[3:]:
        if typ is ctypes.c_int:
            setattr(c, name, NCCL_CONFIG_UNDEF_INT)
    c.blocking = 1 if blocking else 0
    return c


class NcclLib:
    """The handful of NCCL host functions the harness needs, with argtypes set."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or nccl_library_path()
        self.lib = ctypes.CDLL(str(self.path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        L = self.lib
        vp, P = ctypes.c_void_p, ctypes.POINTER
        sig = {
            "ncclGetVersion": [P(ctypes.c_int)],
            "ncclGetUniqueId": [P(NcclUniqueId)],
            "ncclCommInitRankConfig": [P(vp), ctypes.c_int, NcclUniqueId, ctypes.c_int, P(NcclConfig)],
            "ncclCommGetAsyncError": [vp, P(ctypes.c_int)],
            "ncclCommAbort": [vp],
            "ncclCommFinalize": [vp],
            "ncclCommDestroy": [vp],
            "ncclMemAlloc": [P(vp), ctypes.c_size_t],
            "ncclMemFree": [vp],
            "ncclCommWindowRegister": [vp, vp, ctypes.c_size_t, P(vp), ctypes.c_int],
            "ncclCommWindowDeregister": [vp, vp],
            "ncclGetErrorString": [ctypes.c_int],
            "ncclGetLastError": [vp],
        }
        for name, args in sig.items():
            fn = getattr(L, name)
            fn.argtypes = args
            fn.restype = ctypes.c_char_p if name in ("ncclGetErrorString", "ncclGetLastError") else ctypes.c_int

    def version(self) -> int:
        v = ctypes.c_int(0)
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return int(v.value)

    def describe(self, rc: int, comm: int | None = None) -> str:
        text = NCCL_RESULTS.get(rc, f"ncclResult {rc}")
        try:
            last = self.lib.ncclGetLastError(comm)
            if last:
                text += f" ({last.decode(errors='replace')})"
        except Exception:  # noqa: BLE001 - best effort: only decorates the error text
            pass
        return text

    def check(self, rc: int, what: str, comm: int | None = None) -> None:
        if rc != NCCL_SUCCESS:
            raise NcclError(f"{what} failed: {self.describe(rc, comm)}")


class NcclError(RuntimeError):
    pass


def nccl_version_code(version: int) -> tuple[int, int, int]:
    """22809 -> (2, 28, 9); codes below 2.9 use the old 1000-based form."""
    if version >= 10000:
        return version // 10000, version // 100 % 100, version % 100
    return version // 1000, version // 100 % 10, version % 100


def wrap_device_pointer(ptr: int, nbytes: int, device: int) -> torch.Tensor:
    """A uint8 torch tensor over device memory the caller owns (zero copy, through __cuda_array_interface__);
    the caller keeps the memory alive as long as the tensor is used."""

    class _Cai:
        __cuda_array_interface__ = {"shape": (int(nbytes),), "typestr": "|u1", "data": (int(ptr), False),
                                    "version": 3, "strides": None}

    with torch.cuda.device(device):
        t = torch.as_tensor(_Cai(), device=f"cuda:{device}")
    if t.data_ptr() != int(ptr):
        raise RuntimeError("wrapping a device pointer as a torch tensor copied it; torch too old?")
    return t


@dataclass
class Window:
    """One symmetric allocation. ``tensor`` is a uint8 view of ``alloc_bytes``; ``peers`` a device int64 table
    of every rank's pointer (what cuco_tensor_t.peers points to); ``peers_host_arr`` the same on the host."""

    name: str
    nbytes: int
    alloc_bytes: int
    local: int
    peers_host: list[int]
    peers: torch.Tensor
    tensor: torch.Tensor
    window: int | None = None  # ncclWindow_t
    keep: list[Any] = field(default_factory=list)  # objects whose lifetime backs the memory
    peers_host_arr: Any = None

    def __post_init__(self) -> None:
        self.peers_host_arr = (ctypes.c_void_p * len(self.peers_host))(*self.peers_host)


class Backend:
    name = "?"
    comm_ptr: int | None = None

    def alloc_window(self, name: str, nbytes: int) -> Window:  # collective
        raise NotImplementedError

    def free_window(self, w: Window) -> None:  # collective
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        self.close()

    def info(self) -> dict[str, Any]:
        return {"backend": self.name}


def _peer_table(peers: list[int], device: int) -> torch.Tensor:
    return torch.tensor(peers, dtype=torch.int64, device=f"cuda:{device}")


class NcclBackend(Backend):
    """A non-blocking NCCL communicator made through ctypes; windows from ncclMemAlloc +
    ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC); peer pointers read on the device by the harness helper
    (ncclGetPeerPointer)."""

    name = "nccl"

    def __init__(self, rank: int, world: int, device: int, chan: Any, helpers: Any, stream: torch.cuda.Stream,
                 init_timeout_s: float = 120.0, header_version: int | None = None) -> None:
        self.rank, self.world, self.device, self.chan = rank, world, device, chan
        self.helpers, self.stream, self.timeout_s = helpers, stream, init_timeout_s
        self.nccl = NcclLib()
        self.version = self.nccl.version()
        if header_version is not None and header_version != self.version:
            # fail the phase on every rank: a candidate built against other headers would misread the structs
            chan.exchange("nccl-version", False, f"NCCL headers {header_version} != loaded library "
                          f"{self.version} ({self.nccl.path})")
        chan.exchange("nccl-version", True)
        self.windows: list[Window] = []
        self.comm = ctypes.c_void_p(None)
        uid = NcclUniqueId()
        ok, msg = True, ""
        if rank == 0:
            try:
                self.nccl.check(self.nccl.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
                chan.store.set("nccl/unique_id", bytes(uid))  # the 128 bytes of ncclUniqueId
            except Exception as exc:  # noqa: BLE001 - reported to every rank, so all fail the phase together
                ok, msg = False, str(exc)
        chan.exchange("nccl-unique-id", ok, msg)
        raw = chan.store.get("nccl/unique_id")
        ctypes.memmove(ctypes.byref(uid), raw, min(len(raw), 128))
        # Blocking: under a non-blocking communicator NCCL 2.28.9 handed back an unfilled devComm from
        # ncclDevCommCreate (seen on an H200, 2026-12-02); phases still exchange status and abort on failure.
        cfg = nccl_config(self.version, blocking=True)
        ok, msg = True, ""
        try:
            rc = self.nccl.lib.ncclCommInitRankConfig(ctypes.byref(self.comm), world, uid, rank, ctypes.byref(cfg))
            if rc not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                raise NcclError(f"ncclCommInitRankConfig failed: {self.nccl.describe(rc)}")
            self._wait("ncclCommInitRankConfig")
        except Exception as exc:  # noqa: BLE001 - reported to every rank, so all fail the phase together
            ok, msg = False, str(exc)
        self._phase("nccl-init", ok, msg)
        self.comm_ptr = int(self.comm.value or 0)

    def _wait(self, what: str) -> None:
        """Poll ncclCommGetAsyncError until the non-blocking operation is done (or fails, or times out)."""
        deadline = time.monotonic() + self.timeout_s
        state = ctypes.c_int(NCCL_IN_PROGRESS)
        while True:
            rc = self.nccl.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(state))
            if rc != NCCL_SUCCESS:
                raise NcclError(f"{what}: ncclCommGetAsyncError failed: {self.nccl.describe(rc)}")
            if state.value == NCCL_SUCCESS:
                return
            if state.value != NCCL_IN_PROGRESS:
                raise NcclError(f"{what} failed: {self.nccl.describe(state.value, self.comm.value)}")
            if time.monotonic() > deadline:
                raise NcclError(f"{what} did not finish within {self.timeout_s:.0f} s")
            time.sleep(0.001)

    def _phase(self, phase: str, ok: bool, msg: str) -> None:
        try:
            self.chan.exchange(phase, ok, msg, timeout_s=self.timeout_s + 30)
        except Exception:
            self.abort()
            raise

    def alloc_window(self, name: str, nbytes: int) -> Window:
        size = round_up(nbytes)
        ptr = ctypes.c_void_p(None)
        win = ctypes.c_void_p(None)
        ok, msg = True, ""
        try:
            self.nccl.check(self.nccl.lib.ncclMemAlloc(ctypes.byref(ptr), size), f"ncclMemAlloc({size})")
            rc = self.nccl.lib.ncclCommWindowRegister(self.comm, ptr, size, ctypes.byref(win),
                                                      NCCL_WIN_COLL_SYMMETRIC)
            if rc not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                raise NcclError(f"ncclCommWindowRegister({name}) failed: {self.nccl.describe(rc)}")
            self._wait(f"ncclCommWindowRegister({name})")
        except Exception as exc:  # noqa: BLE001 - reported to every rank, so all fail the phase together
            ok, msg = False, str(exc)
        self._phase(f"window:{name}", ok, msg)
        local, handle = ptr.value, win.value
        if local is None or handle is None:  # the phase above raised unless NCCL reported success
            raise NcclError(f"window {name}: NCCL reported success but returned a null pointer")
        table = torch.zeros(self.world, dtype=torch.int64, device=f"cuda:{self.device}")
        rc = self.helpers.cuco_h_fill_peer_table(win, ctypes.c_void_p(table.data_ptr()), self.world,
                                                 ctypes.c_void_p(self.stream.cuda_stream))
        ok, msg = rc == 0, "" if rc == 0 else f"peer table of {name}: {self.helpers.error_name(rc)}"
        peers = table.cpu().tolist() if ok else []
        if ok and peers[self.rank] != local:
            # NCCL's LSA view of our own window is a second mapping of the same memory; the ABI promises
            # peers[rank] == local, so the table carries the allocation's own address for this rank.
            peers[self.rank] = local
            table[self.rank] = local
        self._phase(f"peers:{name}", ok, msg)
        tensor = wrap_device_pointer(local, size, self.device)
        w = Window(name, int(nbytes), size, local, peers, table, tensor, handle)
        self.windows.append(w)
        return w

    def free_window(self, w: Window) -> None:
        ok, msg = True, ""
        try:
            torch.cuda.synchronize(self.device)
            rc = self.nccl.lib.ncclCommWindowDeregister(self.comm, ctypes.c_void_p(w.window))
            if rc not in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                raise NcclError(f"ncclCommWindowDeregister({w.name}): {self.nccl.describe(rc)}")
            self._wait(f"ncclCommWindowDeregister({w.name})")
            self.nccl.check(self.nccl.lib.ncclMemFree(ctypes.c_void_p(w.local)), f"ncclMemFree({w.name})")
        except Exception as exc:  # noqa: BLE001 - reported to every rank, so all fail the phase together
            ok, msg = False, str(exc)
        if w in self.windows:
            self.windows.remove(w)
        self._phase(f"free:{w.name}", ok, msg)

    def close(self) -> None:
        if not self.comm.value:
            return
        for w in list(self.windows):
            self.free_window(w)
        try:
            rc = self.nccl.lib.ncclCommFinalize(self.comm)
            if rc in (NCCL_SUCCESS, NCCL_IN_PROGRESS):
                self._wait("ncclCommFinalize")
            self.nccl.lib.ncclCommDestroy(self.comm)
        except Exception:  # noqa: BLE001 - any failure to finalize: abort instead
            self.nccl.lib.ncclCommAbort(self.comm)
        self.comm = ctypes.c_void_p(None)

    def abort(self) -> None:
        if self.comm.value:
            self.nccl.lib.ncclCommAbort(self.comm)
            self.comm = ctypes.c_void_p(None)

    def info(self) -> dict[str, Any]:
        return {"backend": "nccl", "nccl_version": self.version}


class SymmBackend(Backend):
    """Ranks are processes sharing one GPU; windows from torch symmetric memory (`empty` + `rendezvous` over
    the gloo world group; TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 lets ranks share the device)."""

    name = "symm"

    def __init__(self, rank: int, world: int, device: int, chan: Any, group: Any) -> None:
        import torch.distributed._symmetric_memory as symm_mem  # noqa: PLC0415 - only symm needs it (~40 ms a rank)

        self.rank, self.world, self.device, self.chan, self.group = rank, world, device, chan, group
        self.symm_mem = symm_mem
        self.windows: list[Window] = []
        ok, msg = True, ""
        if os.environ.get("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES") != "1" and world > 1:
            ok, msg = False, "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 is not set in the rank environment"
        chan.exchange("symm-env", ok, msg)
        try:
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(group.group_name)
        except Exception:  # noqa: BLE001 - newer torch enables every group; older needs the call
            pass

    def alloc_window(self, name: str, nbytes: int) -> Window:
        size = round_up(nbytes)
        ok, msg, t, peers, h = True, "", None, [], None
        try:
            t = self.symm_mem.empty(size, dtype=torch.uint8, device=f"cuda:{self.device}")
            h = self.symm_mem.rendezvous(t, self.group)
            bases = [int(p) for p in h.buffer_ptrs]
            offset = t.data_ptr() - bases[self.rank]
            peers = [b + offset for b in bases]
            if len(peers) != self.world:
                raise RuntimeError(f"rendezvous returned {len(peers)} peers for world {self.world}")
        except Exception as exc:  # noqa: BLE001 - reported to every rank, so all fail the phase together
            ok, msg = False, f"symmetric window {name}: {type(exc).__name__}: {exc}"
        self.chan.exchange(f"window:{name}", ok, msg)
        assert t is not None
        w = Window(name, int(nbytes), size, t.data_ptr(), peers, _peer_table(peers, self.device), t, None, [h])
        self.windows.append(w)
        return w

    def free_window(self, w: Window) -> None:
        torch.cuda.synchronize(self.device)
        if w in self.windows:
            self.windows.remove(w)
        self.chan.exchange(f"free:{w.name}", True)  # nobody frees while a peer may still map it
        w.keep.clear()

    def close(self) -> None:
        for w in list(self.windows):
            self.free_window(w)

    def info(self) -> dict[str, Any]:
        return {"backend": "symm", "symm_mem_backend": str(self._symm_backend())}

    def _symm_backend(self) -> str | None:
        try:
            return self.symm_mem.get_backend(torch.device(f"cuda:{self.device}"))
        except Exception:  # noqa: BLE001 - best effort: info for provenance only
            return None
