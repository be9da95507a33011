"""ctypes mirror of the frozen candidate ABI v1 (cuco_kit/runtime/cuco_abi.h) and of the runtime's wait control
block (cuco_kit/runtime/cuco_waits.h, CUCO_WAITS_VERSION 1: the harness's side of the bounded waits).

The layout must match the headers byte for byte: tests/unit/evaluate/test_harness_cpu.py compiles a C program
against the headers and compares sizeof/offsetof of every field with this module. Change the header, bump its
version, change this file, in that order.
"""
from __future__ import annotations

import ctypes

CUCO_ABI_VERSION = 1
CUCO_MAX_TENSORS = 16
CUCO_MAX_PARAMS = 32
CUCO_MAX_SCRATCH = 8
CUCO_MAX_RANKS = 64
CUCO_NAME_LEN = 32
CUCO_WAITS_VERSION = 1

BACKENDS = {"nccl": 0, "symm": 1}
ROLES = {"input": 1, "output": 2, "inout": 3}
ERROR_NAMES = {0: "CUCO_OK", 1: "CUCO_ERR_ABI", 2: "CUCO_ERR_CUDA", 3: "CUCO_ERR_NCCL", 4: "CUCO_ERR_CUBLAS",
               5: "CUCO_ERR_PARAM", 6: "CUCO_ERR_BACKEND"}


class CucoTensor(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * CUCO_NAME_LEN),
        ("role", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("shape", ctypes.c_int64 * 4),
        ("local", ctypes.c_void_p),
        ("peers", ctypes.c_void_p),       # void* const* (device table)
        ("peers_host", ctypes.c_void_p),  # void* const* (host table)
        ("capacity_bytes", ctypes.c_size_t),
        ("valid_bytes", ctypes.c_size_t),
        ("window", ctypes.c_void_p),
    ]


class CucoFlags(ctypes.Structure):
    _fields_ = [
        ("local", ctypes.c_void_p),
        ("peers", ctypes.c_void_p),
        ("peers_host", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("window", ctypes.c_void_p),
    ]


class CucoScratchRequest(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * CUCO_NAME_LEN),
        ("bytes", ctypes.c_size_t),
    ]


class CucoCtx(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("local_rank", ctypes.c_int),
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("nccl_comm", ctypes.c_void_p),
        ("stream", ctypes.c_void_p),  # cudaStream_t
        ("cublas", ctypes.c_void_p),
        ("n_params", ctypes.c_int),
        ("param_names", (ctypes.c_char * CUCO_NAME_LEN) * CUCO_MAX_PARAMS),
        ("params", ctypes.c_int64 * CUCO_MAX_PARAMS),
        ("user", ctypes.c_void_p),
        ("n_tensors", ctypes.c_int),
        ("tensors", CucoTensor * CUCO_MAX_TENSORS),
        ("flags", CucoFlags),
        ("n_scratch", ctypes.c_int),
        ("scratch", CucoTensor * CUCO_MAX_SCRATCH),
        ("epoch", ctypes.c_uint64),
    ]


class CucoWaitCtl(ctypes.Structure):
    """cuco_wait_ctl_t: the harness's words (version, limit, abort) and the record of the wait that gave up."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("limit_ns", ctypes.c_uint64),
        ("abort", ctypes.c_uint32),
        ("gave_up", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),       # cuco_wait_kind_t (CUCO_WAIT_FLAG ... below)
        ("ended_by", ctypes.c_uint32),   # cuco_wait_end_t: CUCO_WAIT_LIMIT or CUCO_WAIT_ABORT
        ("word", ctypes.c_uint64),       # the address it polled, in this process
        ("target", ctypes.c_uint64),
        ("seen", ctypes.c_uint64),
        ("waited_ns", ctypes.c_uint64),
        ("peer", ctypes.c_int32),
        ("index", ctypes.c_int32),
        ("block", ctypes.c_uint32 * 3),
        ("thread", ctypes.c_uint32),
    ]


CUCO_WAIT_FLAG, CUCO_WAIT_LSA_BARRIER, CUCO_WAIT_HOST_NCCL = 1, 2, 3  # cuco_wait_kind_t
CUCO_WAIT_GIN_SIGNAL, CUCO_WAIT_GIN_COUNTER = 4, 5  # cuco_wait_kind_t: GIN waits under symm (gin_compat.h)
CUCO_WAIT_LIMIT, CUCO_WAIT_ABORT = 1, 2  # cuco_wait_end_t


def new_ctx() -> CucoCtx:
    """A zeroed context with the version fields set, as every candidate's CUCO_CHECK_ABI expects."""
    ctx = CucoCtx()
    ctx.abi_version = CUCO_ABI_VERSION
    ctx.struct_size = ctypes.sizeof(CucoCtx)
    return ctx


def set_name(obj: ctypes.Structure, field: str, name: str, index: int | None = None) -> None:
    """Write a name into a fixed char[CUCO_NAME_LEN] field of ``obj`` (``index`` for the param_names table).
    Through the address, because reading a char-array field in ctypes gives a bytes copy, not the array. Too
    long is an error, not a silent truncation."""
    raw = name.encode("utf-8")
    if len(raw) >= CUCO_NAME_LEN:
        raise ValueError(f"name {name!r} is longer than {CUCO_NAME_LEN - 1} bytes (CUCO_NAME_LEN in cuco_abi.h)")
    addr = ctypes.addressof(obj) + getattr(type(obj), field).offset + (index or 0) * CUCO_NAME_LEN
    ctypes.memset(addr, 0, CUCO_NAME_LEN)
    ctypes.memmove(addr, raw, len(raw))


def layout() -> dict[str, int]:
    """sizeof/offsetof of every struct and field, keyed like the C test prints them (``ctx.flags``...)."""
    out: dict[str, int] = {}
    for tag, struct in (("tensor", CucoTensor), ("flags", CucoFlags), ("scratch_req", CucoScratchRequest),
                        ("ctx", CucoCtx), ("wait_ctl", CucoWaitCtl)):
        out[f"sizeof.{tag}"] = ctypes.sizeof(struct)
        for name, *_ in struct._fields_:
            out[f"{tag}.{name}"] = getattr(struct, name).offset
    return out
