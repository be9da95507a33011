"""The communication analyzer is exact on tricky snippets: every expectation below was derived by reading the
snippet files in tests/data/analysis/ (line numbers included), not by running the analyzer."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cuco_kit.cli import main
from cuco_kit.commands import analyze as analyze_command
from cuco_kit.errors import BadInput
from cuco_kit.source.analysis import analyze, analyze_file

DATA = Path(__file__).resolve().parents[2] / "data" / "analysis"


def _report(name: str):
    return analyze_file(DATA / name)


def _edges(rep):
    nodes = {n["id"]: n for n in rep.graph.nodes}
    return [(nodes[e["src"]]["name"], nodes[e["src"]]["line"], nodes[e["dst"]]["name"], nodes[e["dst"]]["line"],
             e["buffer"], e["kind"], e["order"]) for e in rep.graph.edges]


# --- produce -> allgather -> consume ---------------------------------------------------------------------------


def test_comments_strings_and_macro_bodies_are_not_calls():
    rep = _report("produce_allgather_consume.cu")
    # ncclAllReduce (comment, #define body), ncclBroadcast (block comment), the string's ncclAllGather: none count.
    assert [(c.call, c.line) for c in rep.collectives] == [("ncclAllGather", 33)]
    assert rep.p2p == []
    assert [la.kernel for la in rep.launches] == ["produce", "consume"]  # scale<<<>>> in a comment is not one


def test_macro_wrapped_multiline_collective():
    c = _report("produce_allgather_consume.cu").collectives[0]
    assert (c.line, c.end_line, c.function, c.wrapper) == (33, 36, "run", "NCCLCHECK")
    assert (c.send, c.recv, c.buffers, c.stream, c.comm) == ("send", "recv", ["send", "recv"], "s", "comm")
    assert (c.count, c.datatype) == ("n", "ncclFloat")


def test_allocations_cuda_vs_nccl():
    rep = _report("produce_allgather_consume.cu")
    got = [(a.call, a.buffer, a.line, a.bytes, a.kind) for a in rep.allocations]
    assert got == [
        ("cudaMalloc", "input", 28, "n * sizeof(float)", "cuda"),
        ("cudaMalloc", "send", 29, "n * sizeof(float)", "cuda"),
        ("ncclMemAlloc", "recv", 30, "(size_t)nranks * n * sizeof(float)", "nccl"),
        ("cudaMallocAsync", "result", 31, "nranks * n * sizeof(float)", "cuda"),
    ]
    assert rep.allocations[3].stream == "s"
    assert [(s.call, s.line, s.buffer) for s in rep.setup] == [("ncclMemAlloc", 30, "recv")]
    assert [(s.call, s.stream, s.line, s.flags) for s in rep.streams] == [
        ("cudaStreamCreateWithFlags", "s", 27, "cudaStreamNonBlocking")]
    assert [(s.call, s.line, s.target) for s in rep.syncs] == [("cudaStreamSynchronize", 38, "s")]


def test_kernel_params_and_roles():
    rep = _report("produce_allgather_consume.cu")
    produce, consume = rep.kernels
    assert (produce.name, produce.line, consume.name, consume.line) == ("produce", 12, "consume", 17)
    assert [(p.name, p.pointer, p.const, p.reads, p.writes) for p in produce.params] == [
        ("out", True, False, False, True), ("in", True, True, True, False), ("n", False, False, True, False)]
    # consume stores through a local derived from `result` (float* dst = result + i; *dst = ...).
    assert [(p.name, p.reads, p.writes) for p in consume.params] == [
        ("gathered", True, False), ("result", False, True), ("n", True, False)]


def test_graph_produce_allgather_consume():
    rep = _report("produce_allgather_consume.cu")
    assert [(n["kind"], n["name"], n["line"], n["stream"]) for n in rep.graph.nodes] == [
        ("kernel", "produce", 32, "s"), ("collective", "ncclAllGather", 33, "s"), ("kernel", "consume", 37, "s")]
    assert _edges(rep) == [
        ("produce", 32, "ncclAllGather", 33, "send", "produce", "stream"),
        ("ncclAllGather", 33, "consume", 37, "recv", "consume", "stream"),
    ]
    assert rep.graph.stream_order == {"s": [0, 1, 2]}


def test_cli_json_keys(capsys):
    assert analyze_command.run(argparse.Namespace(file=str(DATA / "produce_allgather_consume.cu"), json=True)) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"collectives", "kernels", "launches", "allocations", "graph", "features"} <= set(out)
    assert {k: out["collectives"][0][k] for k in ("call", "line", "stream", "buffers")} == {
        "call": "ncclAllGather", "line": 33, "stream": "s", "buffers": ["send", "recv"]}
    assert {k: out["launches"][1][k] for k in ("kernel", "line", "stream", "grid", "block", "smem")} == {
        "kernel": "consume", "line": 37, "stream": "s", "grid": "(nranks * n + 255) / 256", "block": "256",
        "smem": "0"}
    assert {k: out["allocations"][2][k] for k in ("call", "buffer", "line", "bytes")} == {
        "call": "ncclMemAlloc", "buffer": "recv", "line": 30, "bytes": "(size_t)nranks * n * sizeof(float)"}
    assert [(e["buffer"], e["kind"]) for e in out["graph"]["edges"]] == [("send", "produce"), ("recv", "consume")]


def test_cli_human_summary(capsys):
    assert analyze_command.run(argparse.Namespace(file=str(DATA / "produce_allgather_consume.cu"), json=False)) == 0
    out = capsys.readouterr().out
    assert "1 collective(s)" in out and "L33 ncclAllGather(send, recv) stream=s" in out


# --- groups and loops of send/recv -----------------------------------------------------------------------------


def test_groups_with_send_recv_loop():
    rep = _report("group_p2p_loop.cu")
    assert [(c.call, c.line, c.end_line, c.in_loop, c.group, c.peer, c.stream) for c in rep.p2p] == [
        ("ncclSend", 9, 9, True, 0, "peer", "stream"),
        ("ncclRecv", 10, 11, True, 0, "peer", "stream"),
    ]
    assert [(p.send, p.recv) for p in rep.p2p] == [("sendbuf", None), (None, "recvbuf")]
    assert [(g.function, g.start_line, g.end_line, [c["line"] for c in g.calls]) for g in rep.groups] == [
        ("exchange", 7, 13, [9, 10]),
        ("main", 28, 31, [29, 30]),
    ]
    assert [(c.call, c.line, c.group, c.buffers) for c in rep.collectives] == [
        ("ncclAllReduce", 29, 1, ["a"]), ("ncclBroadcast", 30, 1, ["a", "b"])]
    assert [(s.call, s.line, s.handle) for s in rep.setup] == [
        ("ncclGetUniqueId", 21, "id"), ("ncclCommInitRank", 22, "comm"), ("ncclCommDestroy", 33, None)]


def test_graph_inlines_helpers_with_caller_buffers():
    rep = _report("group_p2p_loop.cu")
    # exchange() is called from main after the group of collectives: its send/recv land there, with main's
    # buffers and stream bound to the helper's parameters.
    assert [(n["name"], n["line"], n["function"], n["stream"], n["reads"], n["writes"], n["group"])
            for n in rep.graph.nodes] == [
        ("ncclAllReduce", 29, "main", "st", ["a"], ["a"], 0),
        ("ncclBroadcast", 30, "main", "st", ["a"], ["b"], 0),
        ("ncclSend", 9, "exchange", "st", ["a"], [], 1),
        ("ncclRecv", 10, "exchange", "st", [], ["b"], 1),
    ]


# --- launch configurations, templates, cuBLAS, aliases -----------------------------------------------------------


def test_launch_configs_2_3_4_and_templates():
    rep = _report("launches_templates_blas.cu")
    got = [(la.kernel, la.line, la.template_args, la.grid, la.block, la.smem, la.stream) for la in rep.launches]
    assert got == [
        ("fill", 36, "<__nv_bfloat16, 256>", "n / 256", "256", None, None),
        ("scale", 37, None, "dim3(n / 256)", "dim3(256)", "0", None),
        ("accumulate", 38, "<float>", "n / 256", "256", "0", "ctx->user->comm_stream"),
    ]
    assert [(k.name, k.is_definition, k.template_params, k.launch_bounds) for k in rep.kernels] == [
        ("fill", True, ["typename T", "int kBlock"], "__launch_bounds__(256)"),
        ("scale", True, [], None),
        ("accumulate", False, ["typename T"], None),
    ]
    # aliases resolved: a -> cuco_tensor(ctx, "A")->local through two locals and a cast.
    assert rep.launches[0].writes == ['cuco_tensor(ctx, "A")->local']
    assert rep.launches[1].args == ["tmp", "2.0f", "n"]
    assert (rep.launches[1].reads, rep.launches[1].writes) == (["ctx->scratch[0].local"], ["ctx->scratch[0].local"])


def test_cublas_is_a_compute_node_with_buffers_and_stream():
    rep = _report("launches_templates_blas.cu")
    (b,) = rep.blas
    assert (b.call, b.line, b.handle, b.stream) == ("cublasGemmEx", 42, "ctx->cublas", "ctx->stream")
    assert b.reads == ["ctx->tensors[1].local", 'cuco_tensor(ctx, "A")->local']
    assert b.writes == ["ctx->tensors[2].local"]
    assert [(n["kind"], n["name"]) for n in rep.graph.nodes][-1] == ("blas", "cublasGemmEx")
    assert ("fill", 36, "cublasGemmEx", 42, 'cuco_tensor(ctx, "A")->local', "data", "default_stream") in _edges(rep)
    assert [(e.call, e.line, e.event, e.stream) for e in rep.events] == [
        ("cudaEventRecord", 39, "ctx->user->ready", "ctx->user->comm_stream"),
        ("cudaStreamWaitEvent", 40, "ctx->user->ready", "ctx->stream"),
    ]
    f = rep.features()
    assert f["uses_cublas"] and not f["uses_host_comm"] and f["n_kernels"] == 3 and f["n_events"] == 1


# --- streams, events and ordering ---------------------------------------------------------------------------


def test_edge_ordering_event_race_and_host_sync():
    rep = _report("two_streams_events.cu")
    assert _edges(rep) == [
        ("gemm_tile", 9, "ncclAllGather", 17, "partial", "produce", "event"),
        ("ncclAllGather", 17, "epilogue", 18, "full", "consume", "unordered"),
        ("ncclAllGather", 17, "epilogue", 20, "full", "consume", "host_sync"),
    ]
    assert rep.graph.nodes[0]["function"] == "launch_gemm" and rep.graph.nodes[0]["stream"] == "compute"
    assert rep.launches[0].stream == "stream"  # the record list keeps the call site as written
    assert rep.features()["n_streams"] == 2


# --- device-initiated code -------------------------------------------------------------------------------------


def test_device_api_features():
    rep = _report("device_lsa.cu")
    assert rep.collectives == [] and rep.groups == []
    f = rep.features()
    assert f["uses_device_api"] and f["uses_lsa"] and not f["uses_gin"] and not f["uses_host_collectives"]
    assert f["has_flags_wait"]
    assert rep.flag_waits == [{"kind": "spin", "function": "push_and_wait", "line": 15}]
    assert rep.device_api_names == ["ncclDevComm", "ncclGetLsaPointer", "ncclWindow_t"]
    (la,) = rep.launches
    assert (la.kernel, la.line, la.end_line, la.stream) == ("push_and_wait", 21, 23, "ctx->stream")
    assert la.reads == ["ctx->tensors[0].local", "ctx->flags.local"] and la.writes == []


def test_host_only_source_has_no_device_api():
    f = _report("produce_allgather_consume.cu").features()
    assert not f["uses_device_api"] and not f["has_flags_wait"] and f["uses_host_collectives"]


# --- inline snippets ------------------------------------------------------------------------------------------


def test_if0_raw_strings_qualified_names_and_comment_arguments():
    code = (
        "void f(float* a, float* b, ncclComm_t comm, cudaStream_t s) {\n"  # 1
        "#if 0\n"  # 2
        "  ncclAllReduce(a, a, 1, ncclFloat, ncclSum, comm, s);\n"  # 3
        "#else\n"  # 4
        "  ncclAllGather(a, b, 1, ncclFloat, comm, s);\n"  # 5
        "#endif\n"  # 6
        "  ::ncclBroadcast(a, /* recv */ b, 1, ncclFloat, 0, comm, s);\n"  # 7
        '  auto r = R"(ncclReduce(a, b, 1, ncclFloat, ncclSum, 0, comm, s))";\n'  # 8
        "}\n"
    )
    rep = analyze(code)
    assert [(c.call, c.line, c.buffers) for c in rep.collectives] == [
        ("ncclAllGather", 5, ["a", "b"]), ("ncclBroadcast", 7, ["a", "b"])]
    assert rep.collectives[1].root == "0"


def test_pointer_offsets_casts_and_reassigned_aliases():
    code = (
        "__global__ void k(float* out, int n);\n"  # 1
        "void g(Tensor* t, ncclComm_t comm, cudaStream_t s, int rank, size_t n) {\n"  # 2
        "  auto* x = (float*)t->local;\n"  # 3
        "  float* y = x + rank * n;\n"  # 4
        "  ncclAllGather(y, x, n, ncclFloat, comm, s);\n"  # 5
        "  for (int c = 0; c < 4; ++c) {\n"  # 6
        "    k<<<1, 32, 0, s>>>(reinterpret_cast<float*>(&x[c * n]), n);\n"  # 7
        "  }\n"
        "}\n"
    )
    rep = analyze(code)
    (c,) = rep.collectives
    assert (c.send, c.recv, c.buffers) == ("t->local", "t->local", ["t->local"])
    (la,) = rep.launches
    assert la.in_loop and la.kernel_known and la.writes == ["t->local"]
    # the kernel is only declared: `out` may be written, so the launch depends on the gather's output
    assert [(e["buffer"], e["kind"]) for e in rep.graph.edges] == [("t->local", "consume")]


def test_cuda_launch_kernel_api_and_peer_copies():
    code = (
        "__global__ void k(float* p);\n"  # 1
        "void h(float* dst, float** peers, int r, size_t bytes, cudaStream_t s) {\n"  # 2
        "  void* args[] = {&dst};\n"  # 3
        "  cudaLaunchCooperativeKernel((void*)k, dim3(132), dim3(256), args, 0, s);\n"  # 4
        "  cudaMemcpyAsync(dst, peers[r], bytes, cudaMemcpyDeviceToDevice, s);\n"  # 5
        "}\n"
    )
    rep = analyze(code)
    (la,) = rep.launches
    assert (la.kernel, la.via, la.grid, la.block, la.smem, la.stream, la.line) == (
        "k", "cudaLaunchCooperativeKernel", "dim3(132)", "dim3(256)", "0", "s", 4)
    (cp,) = rep.copies
    assert (cp.call, cp.dst, cp.src, cp.stream, cp.peer, cp.line) == (
        "cudaMemcpyAsync", "dst", "peers[r]", "s", True, 5)
    assert rep.features()["uses_copy_engine"]


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, needle", [
    (b"Hello, this is prose.\nNothing to see here (really).\n", "no C++/CUDA function definition"),
    (b"import os\ndef f(x):\n    return x\n", "no C++/CUDA function definition"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary"),
    (b"   \n\n", "empty"),
    (b"\xff\xfe int main() {}", "not UTF-8"),
])
def test_bad_input_is_one_clear_line(tmp_path, content, needle):
    f = tmp_path / "in.cu"
    f.write_bytes(content)
    with pytest.raises(BadInput) as exc:
        analyze_file(f)
    msg = str(exc.value)
    assert needle in msg and str(f) in msg and "\n" not in msg


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        analyze_command.run(argparse.Namespace(file=str(tmp_path / "absent.cu"), json=True))


def test_cli_entry_reports_bad_input_as_one_line(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("just words here\n")
    assert main(["analyze", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cuco analyze:") and "no C++/CUDA function definition" in err and "\n" not in err


# --- sample seeds (written by the samples' helper; expectations read off the files) ------------------------------

SAMPLES = Path(__file__).resolve().parents[3] / "sample_kernels"


def _seed(rel: str):
    path = SAMPLES / rel
    if not path.is_file():
        pytest.skip(f"{rel} not present yet")
    return analyze_file(path)


def test_allgather_seed_nccl_exact():
    rep = _seed("allgather/seed_nccl.cu")
    assert [(c.call, c.line, c.function, c.args) for c in rep.collectives] == [
        ("ncclAllGather", 31, "cuco_step",
         ["x->local", "y->local", "n", "ncclBfloat16", "(ncclComm_t)ctx->nccl_comm", "ctx->stream"])]
    c = rep.collectives[0]
    assert (c.send, c.recv, c.stream, c.comm) == (
        'cuco_tensor(ctx, "x")->local', 'cuco_tensor(ctx, "y")->local', "ctx->stream", "ctx->nccl_comm")
    assert rep.p2p == rep.groups == rep.launches == rep.kernels == rep.allocations == rep.copies == []
    assert [(n["kind"], n["line"]) for n in rep.graph.nodes] == [("collective", 31)] and rep.graph.edges == []
    f = rep.features()
    assert f["uses_host_collectives"] and not f["uses_device_api"] and not f["uses_copy_engine"]


def test_allgather_seed_copy_exact():
    rep = _seed("allgather/seed_copy.cu")
    assert rep.collectives == rep.p2p == rep.launches == rep.kernels == []
    assert [(c.call, c.line, c.dst, c.src, c.bytes, c.stream, c.peer, c.in_loop) for c in rep.copies] == [
        ("cudaMemcpyAsync", 38, 'cuco_tensor(ctx, "y")->local', 'cuco_tensor(ctx, "x")->peers_host[src]',
         "slice_bytes", "ctx->stream", True, True)]
    f = rep.features()
    assert f["uses_copy_engine"] and not f["uses_host_comm"] and f["n_streams"] == 1


def test_summary_counts_the_default_stream_apart_from_created_ones():
    """A helper that takes the created stream, and a cudaMemset on the default stream: one stream, not two."""
    code = """#include <nccl.h>
#include <cuda_runtime.h>
__global__ void k(float* x) { x[0] = 1; }
void step(float* d, ncclComm_t comm, cudaStream_t s) {
  k<<<1, 32, 0, s>>>(d);
  ncclAllReduce(d, d, 16, ncclFloat, ncclSum, comm, s);
}
int main() {
  cudaStream_t stream; cudaStreamCreate(&stream);
  float* d; cudaMalloc(&d, 64);
  cudaMemset(d, 0, 64);
  ncclComm_t comm;
  for (int i = 0; i < 3; ++i) step(d, comm, stream);
}
"""
    first = analyze(code, "helper.cu").summary().splitlines()[0]
    assert first.endswith("1 stream(s) and the default stream"), first
    assert analyze(code.replace("  cudaMemset(d, 0, 64);\n", ""), "helper.cu").summary().splitlines()[0] \
        .endswith(", 1 stream(s)")
