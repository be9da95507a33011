// seed_copy.cu — expert-parallel MoE layer, host-driven through the copy engines (the seed where host NCCL cannot
// run, e.g. `symm`): flag handshakes, then peer cudaMemcpyAsync pulls for dispatch and return.
// cuco: backends=symm,nccl
//
// Same computation, tensors, scratch windows and row layouts as seed_nccl.cu (read its header first); only the
// transport differs. One step, everything on ctx->stream:
//   route:    as in seed_nccl.cu; this rank's counts row lands in its own counts window, row `rank`
//   ready:    signal_all raises candidate flag kReady + rank on every rank (release, system scope, after a
//             system fence: the route kernels before it on this stream wrote send and counts); wait_all spins
//             until every rank's kReady flag reached ctx->epoch (acquire)
//   counts:   each rank's counts row is copied to the host straight from that rank's window; the stream is
//             synchronised (cuBLAS takes row counts on the host)
//   dispatch: per (source, local expert) one cudaMemcpyAsync PULL of wire rows from the source's send window
//             into recv (FP8=1: encoded before the ready flag, arrived rows decoded after the pulls)
//   experts:  as in seed_nccl.cu
//   done:     signal_all / wait_all on kOutReady: every rank's expert outputs are in its out window
//   return:   per (expert rank, expert) one cudaMemcpyAsync pull from that rank's out window into ret
//   combine:  as in seed_nccl.cu
// Flags follow the ABI's epoch protocol (cuco_abi.h): producers store ctx->epoch, consumers wait for >= epoch, so
// nothing is reset. Reuse of the windows across steps relies on the harness: every step ends with a synchronise
// and a host + device barrier, so nobody rewrites send / out while a peer still pulls from them.
// The copies are done by DMA engines through the mappings the harness made (torch symmetric memory under `symm`,
// NVLink peer mappings under `nccl`). Under `symm` the ranks share one GPU and one L2: timings say nothing
// about NVLink. Nothing overlaps, on purpose (the simple baseline).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "cuco_lsa.h"  // cuco_signal / cuco_wait and the flag layout (CUCO_FLAGS_RESERVED)
#include "moe_host.cuh"     // the workload's shared host code: frozen, on the include path (build.for_workload)
#include "moe_kernels.cuh"  // the workload's shared kernels: frozen, on the include path (build.for_workload)

namespace {

using namespace moe_host;     // the layer's windows, routing, plan and expert MLP: shared by all three sources
using namespace moe_kernels;  // routing, gather, SwiGLU, combine kernels: shared by all three sources

constexpr const char* kWindowNames[kWindows] = {"send", "recv", "out", "ret", "counts"};
constexpr size_t kReady = 0;  // candidate flag words: [kReady, kReady + W) send + counts of rank s are ready
// [kReady + W, kReady + 2W): expert outputs of rank s are ready

struct State : Layer {
  void* const* send_peers;           // host tables of every rank's windows
  void* const* out_peers;
  void* const* counts_peers;
  uint64_t* const* flag_peers;       // device table of every rank's flag words
  const uint64_t* my_flags;          // this rank's first candidate word

  // Free what setup made (also after a failed setup); cuco_state<State>::close calls it.
  int release(cuco_ctx_t*) {
    close();
    return CUCO_OK;
  }
};

// ---- handshake ----------------------------------------------------------------------------------------------

// Raise flag `word` on every rank: everything this stream ran before (stream order) is published first.
__global__ void signal_all(uint64_t* const* flag_peers, int W, size_t word, uint64_t epoch) {
  __threadfence_system();
  for (int q = threadIdx.x; q < W; q += blockDim.x) cuco_signal(cuco_user_flag(flag_peers, q, word), epoch);
}

// Hold the stream until flags [first, first + W) of this rank reached the epoch.
__global__ void wait_all(const uint64_t* flags, int W, uint64_t epoch) {
  for (int q = threadIdx.x; q < W; q += blockDim.x) cuco_wait(flags + q, epoch);
  __syncthreads();
}

}  // namespace

// The token-row windows and the counts matrix (workload.scratch_bytes gives the same sizes).
CUCO_EXPORT int cuco_declare_scratch(const cuco_ctx_t* ctx, cuco_scratch_request_t* req, int max_req) {
  return declare_windows(ctx, kWindowNames, req, max_req);
}

CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) {
  CUCO_CHECK_ABI(ctx);
  // Any backend whose windows have peer tables; the flag region must hold 2W candidate words.
  State* s = cuco_state<State>::open(ctx);
  int rc = s->open(ctx, kWindowNames);
  const bool peers_ok = rc == CUCO_OK && s->windows[kSend]->peers_host != nullptr &&
                        s->windows[kOut]->peers_host != nullptr && s->windows[kCounts]->peers_host != nullptr;
  const bool flags_ok = ctx->flags.local != nullptr && ctx->flags.peers != nullptr &&
                        ctx->flags.count >= CUCO_FLAGS_RESERVED + kReady + 2 * (size_t)ctx->world_size;
  if (rc == CUCO_OK && !(peers_ok && flags_ok)) rc = CUCO_ERR_PARAM;
  if (rc == CUCO_OK) {
    s->send_peers = s->windows[kSend]->peers_host;
    s->out_peers = s->windows[kOut]->peers_host;
    s->counts_peers = s->windows[kCounts]->peers_host;
    s->flag_peers = ctx->flags.peers;
    s->my_flags = ctx->flags.local + CUCO_FLAGS_RESERVED;
  }
  return cuco_state<State>::settle(ctx, rc);
}

CUCO_EXPORT int cuco_step(cuco_ctx_t* ctx) {
  State* state = cuco_state<State>::get(ctx);
  if (state == nullptr) return CUCO_ERR_PARAM;
  State& s = *state;
  CUCO_TRY(refuse_capture(ctx->stream));
  cudaStream_t st = ctx->stream;
  cublasHandle_t handle = (cublasHandle_t)ctx->cublas;
  CUCO_CUBLAS_TRY(cublasSetStream(handle, st));
  CUCO_TRY(s.read_valid_rows(ctx));
  const int me = s.rank, W = s.W, E = s.E, EL = s.EL;
  const size_t H = (size_t)s.H;

  // route
  CUCO_TRY(s.route(st));

  // ready: send and counts of every rank, then the counts matrix on the host
  const uint64_t epoch = ctx->epoch;
  const size_t out_ready = kReady + (size_t)W;
  signal_all<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, kReady + me, epoch);
  wait_all<<<1, kWarpSize, 0, st>>>(s.my_flags + kReady, W, epoch);
  CUCO_CUDA_TRY(cudaGetLastError());
  for (int src = 0; src < W; ++src)
    CUCO_CUDA_TRY(cudaMemcpyAsync(s.host_counts + (size_t)src * E, (const int*)s.counts_peers[src] + (size_t)src * E,
                                  sizeof(int) * (size_t)E, cudaMemcpyDefault, st));
  CUCO_CUDA_TRY(cudaStreamSynchronize(st));
  CUCO_TRY(s.build_plan());

  // dispatch: pull my experts' rows from every other rank's send window
  for (int src = 0; src < W; ++src) {
    if (src == me) continue;
    const uint8_t* peer_send = (const uint8_t*)s.send_peers[src];
    for (int le = 0; le < EL; ++le) {
      const size_t c = s.cnt(src, me * EL + le);
      if (c)
        CUCO_CUDA_TRY(cudaMemcpyAsync(s.recv_wire + s.rrow(me, le, src) * s.wire_row,
                                      peer_send + s.off(src, me * EL + le) * s.wire_row, c * s.wire_row,
                                      cudaMemcpyDefault, st));
    }
  }
  CUCO_TRY(s.decode_arrived_rows(st));

  // experts: own rows from send (out rows [0, Cap) in send order), arrived rows from recv (out rows Cap + recv row)
  for (int le = 0; le < EL; ++le) {
    CUCO_TRY(s.expert_own(handle, le, st));
    CUCO_TRY(s.expert_arrived(handle, le, st));
  }

  // done: every rank's outputs, then pull mine back from every expert rank's out window
  signal_all<<<1, kWarpSize, 0, st>>>(s.flag_peers, W, out_ready + me, epoch);
  wait_all<<<1, kWarpSize, 0, st>>>(s.my_flags + out_ready, W, epoch);
  CUCO_CUDA_TRY(cudaGetLastError());
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    const __nv_bfloat16* peer_out = (const __nv_bfloat16*)s.out_peers[q];
    for (int le = 0; le < EL; ++le) {
      const size_t c = s.cnt(me, q * EL + le);
      if (c)
        CUCO_CUDA_TRY(cudaMemcpyAsync(s.ret + s.off(me, q * EL + le) * H, peer_out + (s.cap + s.rrow(q, le, me)) * H,
                                      c * H * kBf16Bytes, cudaMemcpyDefault, st));
    }
  }
  CUCO_TRY(s.copy_own_outputs(st));

  // combine
  combine<<<std::max(1, std::min(s.Tr, s.grid)), kThreads, 0, st>>>((const uint4*)s.ret, s.pos, s.w, s.Tr, s.K,
                                                                     s.row_vecs, (uint4*)s.y);
  return cuco_cuda_status(cudaGetLastError());
}

CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return cuco_state<State>::close(ctx); }
