// SPDX-License-Identifier: Apache-2.0
// harness_helpers.cu — device work the harness itself needs inside a rank (never part of a candidate).
//
// Built once per cache into libcuco_harness.so and loaded by every rank worker with ctypes:
//   cuco_h_barrier        a device barrier across ranks over the harness's own words of the flag region
//                         (system-scope release/acquire, epoch-valued, so no reset is ever needed); it runs
//                         right before the start event so every rank's timed step starts together.
//   cuco_h_spin           a single-thread delay (jitter before verification trials: a missing wait on a peer
//                         flag shows when one rank is late).
//   cuco_h_interfere      schedule perturbation of a verification trial (rank/perturb.py): after the work queued
//                         on a stream so far (the device barrier) and a delay, CTAs on a stream of their own, at
//                         the highest priority, that hold SMs for a random time and free them one by one, so the
//                         candidate's CTAs on that rank start late and at different times, whatever it signals with.
//   cuco_h_hold / cuco_h_release  the stream holder of device timing (nvbench's blocking kernel): one thread
//                         spins on a host-mapped word until the host has enqueued the whole step and stores the
//                         release value, so the events time the device's work with the step already queued, not
//                         the host's launches. A hold that is never released gives up after timeout_ns and
//                         raises *timed_out: a step that waits on its own stream (cudaStreamSynchronize inside
//                         cuco_step) cannot deadlock behind it.
//   cuco_h_fill_peer_table  under the nccl backend: each peer's pointer to a registered window, read with
//                         ncclGetPeerPointer (window pointers need the window only, not a devComm).
//   cuco_h_capture        the one-time stream-capture pass around cuco_step (see below).
//   cuco_h_error_name     cudaGetErrorName for the codes returned above.
// Every entry point returns a cudaError_t value (0 = success) so Python checks each call.
#include <cuda_runtime.h>
#include <stdint.h>

#include <cuda/atomic>
#include <nccl.h>
#include <nccl_device.h>

#define CUCO_H_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// System scope: the peers are other processes (symm: other CUDA contexts on this GPU; nccl: other GPUs). The
// same cuda::atomic_ref idiom as the candidates' flags (cuco_devcomm.h).
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  return cuda::atomic_ref<const uint64_t, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread t (< world) tells rank t "rank `rank` reached barrier `epoch`" by storing into word base+rank of rank
// t's region, then waits until rank t has told us the same. A wait longer than timeout_ns gives up and raises
// *timed_out (host-mapped pinned memory) instead of spinning forever: the host reports it as a hang.
__global__ void barrier_kernel(uint64_t* const* peers, size_t base, int rank, int world, uint64_t epoch,
                               uint64_t timeout_ns, volatile int* timed_out) {
  const int t = threadIdx.x;
  if (t >= world) return;
  __threadfence_system();  // earlier work of this stream is visible to peers before they pass the barrier
  st_release_sys(peers[t] + base + rank, epoch);
  const uint64_t* mine = peers[rank] + base + t;
  const uint64_t start = global_ns();
  while (ld_acquire_sys(mine) < epoch) {
    if (global_ns() - start > timeout_ns) {
      if (timed_out) *timed_out = 1 + t;
      return;
    }
    __nanosleep(200);
  }
}

__global__ void spin_kernel(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(500);
}

// splitmix64's finaliser: a per-CTA hold time from one seed.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Threads of one interference CTA: two of them fill an SM's 2048 thread slots, so no candidate CTA can share it.
constexpr int kInterfereThreads = 1024;

// Each CTA holds its SM from the moment it is scheduled for between hold_ns / 2 and hold_ns (drawn per CTA), so
// the SMs come free one by one. One thread keeps the time (sleeping, to leave issue slots and memory to the
// others); the rest wait at the barrier, which keeps every thread slot of the CTA taken until it is done.
__global__ void __launch_bounds__(kInterfereThreads) interfere_kernel(uint64_t hold_ns, uint64_t seed) {
  if (threadIdx.x == 0) {
    const uint64_t until = global_ns() + hold_ns / 2 + mix64(seed ^ blockIdx.x) % (hold_ns / 2 + 1);
    while (global_ns() < until) __nanosleep(1000);
  }
  __syncthreads();
}

// The interference kernel's stream and the event that gates it: made once per process, on the device current at
// the first call (a rank process uses one), at the highest priority, so its CTAs are scheduled ahead of every
// waiting CTA, those of a candidate's high-priority side stream included.
cudaStream_t interference_stream = nullptr;
cudaEvent_t interference_gate = nullptr;

// Holds the stream until *release >= epoch (host-mapped, written by cuco_h_release) or timeout_ns has passed.
__global__ void hold_kernel(const uint64_t* release, uint64_t epoch, uint64_t timeout_ns, volatile int* timed_out) {
  const uint64_t start = global_ns();
  while (ld_acquire_sys(release) < epoch) {
    if (global_ns() - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(100);
  }
}

__global__ void peer_table_kernel(ncclWindow_t win, void** table, int world) {
  const int p = threadIdx.x;
  if (p < world) table[p] = ncclGetPeerPointer(win, 0, p);
}

}  // namespace

CUCO_H_EXPORT int cuco_h_barrier(uint64_t* const* peers_dev, size_t base, int rank, int world, uint64_t epoch,
                                 uint64_t timeout_ns, int* timed_out_host, cudaStream_t stream) {
  if (world < 1 || world > 64 || rank < 0 || rank >= world) return (int)cudaErrorInvalidValue;
  barrier_kernel<<<1, 64, 0, stream>>>(peers_dev, base, rank, world, epoch, timeout_ns, timed_out_host);
  return (int)cudaGetLastError();
}

CUCO_H_EXPORT int cuco_h_spin(uint64_t ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  return (int)cudaGetLastError();
}

// Once the work queued on `after` so far is done, and offset_ns later: `blocks` CTAs of kInterfereThreads threads,
// each holding an SM for hold_ns / 2 .. hold_ns (seeded), on the interference stream. `after` is not held up.
CUCO_H_EXPORT int cuco_h_interfere(cudaStream_t after, uint64_t offset_ns, int blocks, uint64_t hold_ns,
                                   uint64_t seed) {
  if (blocks < 1) return (int)cudaErrorInvalidValue;
  cudaError_t e = cudaSuccess;
  if (interference_stream == nullptr) {
    int lowest = 0, highest = 0;
    e = cudaDeviceGetStreamPriorityRange(&lowest, &highest);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&interference_stream, cudaStreamNonBlocking, highest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&interference_gate, cudaEventDisableTiming);
    if (e != cudaSuccess) return (int)e;
  }
  e = cudaEventRecord(interference_gate, after);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(interference_stream, interference_gate, 0);
  if (e != cudaSuccess) return (int)e;
  if (offset_ns) spin_kernel<<<1, 1, 0, interference_stream>>>(offset_ns);
  interfere_kernel<<<blocks, kInterfereThreads, 0, interference_stream>>>(hold_ns, seed);
  return (int)cudaGetLastError();
}

CUCO_H_EXPORT int cuco_h_hold(const uint64_t* release_host, uint64_t epoch, uint64_t timeout_ns,
                              int* timed_out_host, cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(release_host, epoch, timeout_ns, timed_out_host);
  return (int)cudaGetLastError();
}

// The host half of the hold: a release store the spinning kernel acquires (system scope, host-mapped memory).
CUCO_H_EXPORT int cuco_h_release(uint64_t* release_host, uint64_t epoch) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*release_host).store(epoch, cuda::memory_order_release);
  return 0;
}

CUCO_H_EXPORT int cuco_h_fill_peer_table(void* window, void** table_dev, int world, cudaStream_t stream) {
  if (world < 1 || world > 64) return (int)cudaErrorInvalidValue;
  peer_table_kernel<<<1, 64, 0, stream>>>((ncclWindow_t)window, table_dev, world);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return (int)e;
  return (int)cudaStreamSynchronize(stream);
}

// The stream-capture pass. cuco_step is called while `stream` is being captured (relaxed mode, so legitimate
// calls such as cudaMalloc from other threads do not break it). What the codes mean:
//   out[0] cuco_step's return value (meaningless when the capture failed)
//   out[1] cudaStreamBeginCapture
//   out[2] cudaStreamEndCapture: cudaErrorStreamCaptureUnjoined = work forked off the stream never rejoined;
//          cudaErrorStreamCaptureInvalidated / Unsupported = the step did something capture forbids (e.g.
//          cudaStreamSynchronize): the fork check is inconclusive, which the harness reports as such.
//   out[3] cudaGraphInstantiate, out[4] cudaGraphLaunch (the captured step runs once for real, so host-side NCCL
//          state and the epoch stay in step with the other ranks). Not synchronised here: the caller waits on an
//          event with its watchdog, so a step that never ends is a timeout, not a blocked process.
//   out[5] cudaGetLastError after the capture (clears the non-sticky capture errors)
CUCO_H_EXPORT int cuco_h_capture(int (*step)(void*), void* ctx, cudaStream_t stream, int launch, int* out) {
  for (int i = 0; i < 6; ++i) out[i] = 0;
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
  out[1] = (int)e;
  if (e != cudaSuccess) return (int)e;
  out[0] = step(ctx);
  cudaGraph_t graph = nullptr;
  out[2] = (int)cudaStreamEndCapture(stream, &graph);
  out[5] = (int)cudaGetLastError();
  if (out[2] == cudaSuccess && graph != nullptr) {
    cudaGraphExec_t exec = nullptr;
    // Kernel nodes keep the priority of the stream they were captured from only with this flag; without it the
    // whole graph runs at the launch stream's priority, and a step whose spinning consumer relies on a
    // high-priority producer stream (puts ahead of in-kernel waits) could starve itself here but not eagerly.
    out[3] = (int)cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
    if (out[3] == cudaSuccess) {
      if (launch) {
        out[4] = (int)cudaGraphLaunch(exec, stream);
      }
      cudaGraphExecDestroy(exec);
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  return 0;
}

CUCO_H_EXPORT const char* cuco_h_error_name(int code) { return cudaGetErrorName((cudaError_t)code); }

CUCO_H_EXPORT int cuco_h_capture_status(cudaStream_t stream, int* status) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &s);
  *status = (int)s;
  return (int)e;
}
