// seed_nccl.cu — expert-parallel MoE layer, the host-driven baseline: counts all-gather, grouped ncclSend/ncclRecv
// dispatch, per-expert cuBLAS SwiGLU MLPs, grouped send/recv back, weighted combine.
//
// World size W, E experts, EL = E/W per rank (rank q owns experts [q*EL, (q+1)*EL)); T token capacity per rank,
// of which T_r are valid (x's valid_bytes / (H*2)); top-K routing; hidden H, expert intermediate I (see
// workload.py). Row-major everywhere. Cap = T*min(K, EL) is the most rows one rank can send to one expert rank.
//
//     x          [T, H]       bf16  input   tokens (first T_r valid)
//     topk_idx   [T, K]       i32   input   expert of each (token, slot)
//     topk_w     [T, K]       f32   input   combine weight of each (token, slot)
//     w_gate_up  [EL, H, 2I]  bf16  input   own experts: gate columns [0, I), up columns [I, 2I)
//     w_down     [EL, I, H]   bf16  input   own experts
//     y          [T, H]       bf16  output  first T_r rows
//   scratch windows (declared below, sizes in workload.scratch_bytes):
//     send   [T*K] wire rows  own assignments sorted by expert (all dests; the slice for rank q is contiguous)
//     recv   [(W-1)*Cap] wire rows from other ranks, grouped per local expert, sources ascending within one
//     out    [W*Cap, H]      expert outputs: rows [0, Cap) for own tokens (in send order), then recv's outputs
//     ret    [T*K, H]        every assignment's expert output back home, in send order
//     counts [W, E]          i32: counts[s][e] = rows source s sends to expert e
//
// One step, everything on ctx->stream:
//   route:    count rows per expert, exclusive scan -> send offsets, one warp per assignment claims its row and
//             copies x[t] into send (pos[t*K+k] = its row); FP8=1: the rows are encoded into wire rows
//             (moe_kernels.cuh: e4m3, one fp32 scale per 128 elements) and send holds what they decode to
//   counts:   ncclAllGather of each rank's counts row; copied to the host and the stream synchronised (cuBLAS
//             takes row counts on the host, so every variant reads them there)
//   dispatch: one group: per (peer, expert) ncclSend of the wire rows / ncclRecv into recv (both sides issue
//             them in expert order, so pairs match); FP8=1: arrived rows decoded to bf16 for the GEMMs
//   experts:  per local expert: own rows straight from send, arrived rows from recv (decoded), each
//             gu = X Wgu (cublasGemmEx), act = silu(gu[:, :I]) * gu[:, I:], out = act Wd (cublasGemmEx)
//   return:   one group: per (peer, expert) ncclSend of out rows back / ncclRecv into ret; own rows copied
//   combine:  y[t] = sum_k topk_w[t, k] * ret[pos[t*K+k]] in fp32, rounded to bf16
// Nothing overlaps: that serial chain is what device_lsa.cu and the search race against.
//
// A wire row is the bf16 row (FP8=0, the default) or H e4m3 bytes and H/128 fp32 scales (FP8=1): with FP8=1 the
// send / recv windows hold wire rows and the bf16 rows the GEMMs read live in two local buffers.
// What does not depend on the transport (checks, route, plan, expert MLPs, own-row copy) is moe_host.cuh's, shared
// with the other two sources; the kernels are moe_kernels.cuh's. The step synchronises its stream to read the
// counts, which stream capture forbids: under capture it gives the capture up at once (moe_host.cuh's
// refuse_capture) and the harness runs it eagerly. Host NCCL needs a communicator (ctx->nccl_comm): NCCL's under
// `nccl`; under `symm` the harness binds the host API of runtime/symm_nccl/nccl.h, over the ranks' shared memory.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include <algorithm>

#include "cuco_abi.h"
#include "cuco_errors.h"
#include "cuco_state.h"
#include "moe_host.cuh"     // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_host;     // the layer's windows, routing, plan and expert MLP: shared by all three sources
using namespace moe_kernels;  // routing, gather, SwiGLU, combine kernels: shared by all three sources

constexpr const char* kWindowNames[kWindows] = {"send", "recv", "out", "ret", "counts"};

struct State : Layer {
  // Free what setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t*) {
    close();
    return CUCO_OK;
  }
};

}  // namespace

// The token-row windows and the counts matrix (workload.scratch_bytes gives the same sizes).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_windows(ctx, kWindowNames, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  if (ctx->nccl_comm == nullptr) return CUCO_ERR_BACKEND;
  State* s = cuco_state<State>::open(ctx);
  return cuco_state<State>::settle(ctx, s->open(ctx, kWindowNames));
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* state = cuco_state<State>::get(ctx);
  if (state == nullptr) return CUCO_ERR_PARAM;
  State& s = *state;
  CUCO_TRY(refuse_capture(ctx->stream));
  ncclComm_t comm = (ncclComm_t)ctx->nccl_comm;
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, st));
  CUCO_TRY(s.read_valid_rows(ctx));
  const int me = s.rank, W = s.W, E = s.E, EL = s.EL;
  const size_t H = (size_t)s.H;

  // route
  CUCO_TRY(s.route(st));

  // counts: every rank's row, then on the host
  if (W > 1) CUCO_NCCL_TRY(comm, ncclAllGather(s.counts + (size_t)me * E, s.counts, (size_t)E, ncclInt32, comm, st));
  CUCO_CUDA_TRY(cudaMemcpyAsync(s.host_counts, s.counts, sizeof(int) * (size_t)W * E, cudaMemcpyDeviceToHost, st));
  CUCO_CUDA_TRY(cudaStreamSynchronize(st));
  CUCO_TRY(s.build_plan());

  // dispatch
  if (W > 1) {
    CUCO_NCCL_TRY(comm, ncclGroupStart());
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      for (int le = 0; le < EL; ++le) {
        const size_t c = s.cnt(me, q * EL + le);
        if (c)
          CUCO_NCCL_TRY(comm, ncclSend(s.send_wire + s.off(me, q * EL + le) * s.wire_row, c * s.wire_row, ncclUint8,
                                       q, comm, st));
      }
      for (int le = 0; le < EL; ++le) {
        const size_t c = s.cnt(q, me * EL + le);
        if (c)
          CUCO_NCCL_TRY(comm, ncclRecv(s.recv_wire + s.rrow(me, le, q) * s.wire_row, c * s.wire_row, ncclUint8, q,
                                       comm, st));
      }
    }
    CUCO_NCCL_TRY(comm, ncclGroupEnd());
    CUCO_TRY(s.decode_arrived_rows(st));
  }

  // experts: own rows from send (out rows [0, Cap) in send order), arrived rows from recv (out rows Cap + recv row)
  for (int le = 0; le < EL; ++le) {
    CUCO_TRY(s.expert_own(handle, le, st));
    CUCO_TRY(s.expert_arrived(handle, le, st));
  }

  // return
  if (W > 1) {
    CUCO_NCCL_TRY(comm, ncclGroupStart());
    for (int q = 0; q < W; ++q) {
      if (q == me) continue;
      for (int le = 0; le < EL; ++le) {
        const size_t c = s.cnt(q, me * EL + le);
        if (c) CUCO_NCCL_TRY(comm, ncclSend(s.out + (s.cap + s.rrow(me, le, q)) * H, c * H, ncclBfloat16, q, comm, st));
      }
      for (int le = 0; le < EL; ++le) {
        const size_t c = s.cnt(me, q * EL + le);
        if (c) CUCO_NCCL_TRY(comm, ncclRecv(s.ret + s.off(me, q * EL + le) * H, c * H, ncclBfloat16, q, comm, st));
      }
    }
    CUCO_NCCL_TRY(comm, ncclGroupEnd());
  }
  CUCO_TRY(s.copy_own_outputs(st));

  // combine
  combine<<<std::max(1, std::min(s.Tr, s.grid)), kThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K,
                                                                     s.row_vecs, (uint4*)s.y);
  return cuco_cuda_status(cudaGetLastError());
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
