// Batch-norm kernels: train statistics with the running-stat update, eval invstd, normalise + affine, and
// the backward (per-channel sums of g and g * x_hat, then dx). Formulas follow the CPU reference
// (src/ops/batch_norm.cpp) and its op-based backward node.
//
// Two layouts of x (N, C, S), each with its own grid so that every access is coalesced and no element
// needs a 64-bit division:
//  - channels last (S == 1, x is an (M, C) matrix, e.g. an NHWC activation viewed as (N*H*W, C)): a 2-D
//    block, threadIdx.x along C (one 16-byte pack of V channels per thread), threadIdx.y along rows;
//    blockIdx.x tiles C, blockIdx.y splits the rows. A thread keeps its channels' constants (or sums) in
//    registers.
//  - channels first (S > 1): blockIdx.x is the channel, blockIdx.y splits the channel's N*S values; a
//    block walks (n, s) with 16-byte packs along s (when S is a multiple of the pack) and a 32-bit
//    multiply-shift division by S/V.
// Reductions (statistics and the backward sums) write per-block partial sums in double to a scratch
// buffer ((splits, 2, C)); a finalize kernel adds them in a fixed order (one warp per channel), so results
// are deterministic. Statistics are one pass: sums of (x - K) and (x - K)^2 with K = the channel's first
// value (a sample of the data, so the shifted sums do not cancel), var = E[(x-K)^2] - E[x-K]^2.
// Arithmetic: per-thread sums (and the in-block column sums of the channels-last kernels) and the elementwise
// maps run in float for bf16/f16 and in double for f32/f64; per-block partial sums, statistics and
// per-channel constants are double. Weight, bias and running stats are read in their own dtype (BnParam).
// Fused ReLU (BnAct::relu): the forward writes relu(round(x * scale + shift)); the backward recomputes the
// same value from x with the same per-channel constants and the same fma (bn_affine), so its mask
// (round(v) > 0) is exactly the forward's, and masks g before the sums and dx. BnAct::add_relu adds a
// residual r (x's layout) before the relu, as the add op rounds it; its backward reads r for the mask and
// writes r's gradient (the masked g) next to dx.
// Note [Batch-norm kernels]: the channels-first reductions are finalised by their last block (an atomic
// ticket per channel, bn_tickets; no finalize launch), with bn_*_cf_split + the finalize kernel as the
// fallback when there are no tickets (C > kTicketSlot, or the first use inside a graph capture); both add the
// same partial sums in the same order. The normalize / dx passes walk each block's range backwards (walk: they
// first read what the reduction just read, still in L2). Channels-first kernels are compiled for 8 resident
// 256-thread blocks per SM (6 for dx and sums with a fused activation), channels-last ones for 4 (3 for dx
// and for sums with a fused activation), channels-last grids being one wave of those.
// Channels-first normalize and dx store their 16-byte packs with one explicit 16-byte store (Note [Batch-norm
// 16-byte stores] in batchnorm_common.cuh). Channels-last reductions take the two-level ticket kernels (Note
// [Batch-norm channels-last tickets]) from kClTicketsMinC channels up, the split kernels below.
// Files: this one holds the ticket buffer, the kernel choice and the public launchers, which pick a kernel
// family (batchnorm_launch.cuh): batchnorm_reduce.cu, batchnorm_map.cu, batchnorm_cl2.cu; the shared device
// helpers are in batchnorm_common.cuh.
#include <atomic>
#include <mutex>

#include "cuda/kernels/batchnorm_launch.cuh"

namespace ht::kernels::bn {

// ---- the tickets (Note [Batch-norm kernels]) ----
// Every device has one zeroed buffer of kTicketRing * kTicketSlot counters, allocated at its first use; a
// launch takes the next slot of the ring (round robin) and its last blocks leave every counter they used at
// 0. Launches in one stream are ordered, so a slot is free again when its turn comes; a slot is only shared
// by two running kernels when kTicketRing batch-norm reductions run at once on different streams of one
// device (not done by this framework). Null (use the *_split kernels and a finalize launch) when C exceeds a slot, or when the buffer does
// not exist yet and `stream` is being captured into a graph (allocating there is not allowed).
constexpr int64_t kTicketRing = 32;
constexpr int kMaxDevices = 64;

unsigned* bn_tickets(int64_t n, cudaStream_t stream) {
  static std::mutex mu;
  static unsigned* buffers[kMaxDevices] = {};
  static std::atomic<uint32_t> next[kMaxDevices] = {};
  if (n > kTicketSlot) return nullptr;
  int dev = 0;
  HT_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) return nullptr;
  unsigned* buf = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!buffers[dev]) {
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      HT_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
      if (cs != cudaStreamCaptureStatusNone) return nullptr;
      void* p = nullptr;
      const std::size_t bytes = static_cast<std::size_t>(kTicketSlot * kTicketRing) * sizeof(unsigned);
      HT_CUDA_CHECK(cudaMalloc(&p, bytes));  // kept for the process's lifetime
      HT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
      HT_CUDA_CHECK(cudaStreamSynchronize(stream));  // zero before any other stream can take a slot
      buffers[dev] = static_cast<unsigned*>(p);
    }
    buf = buffers[dev];
  }
  const uint32_t slot = next[dev].fetch_add(1, std::memory_order_relaxed) % kTicketRing;
  return buf + static_cast<int64_t>(slot) * kTicketSlot;
}

}  // namespace ht::kernels::bn

namespace ht::kernels {
namespace {

// Whether the channels-last reductions of C channels take the ticket kernels (batchnorm_cl2.cu): from
// kClTicketsMinC channels up, where they are the faster (H200, bf16, ms split / tickets: on [16384, 256] with
// relu, forward 0.0301 / 0.0258, backward 0.0412 / 0.0395); below, the split kernels (on [262144, 64] the
// statistics are 0.0183 / 0.0171 but the backward sums 0.0310 / 0.0326, the whole backward 0.0649 / 0.0677).
constexpr int64_t kClTicketsMinC = 128;
bool cl_tickets_for(int64_t C) { return C >= kClTicketsMinC; }

// Whether dt is a batch-norm dtype (f32, f64, bf16, f16).
bool supported(DType dt) {
  return visit_kernel_float(dt, [](auto) {});
}

}  // namespace

void launch_bn_stats(DType dt, const void* x, BnShape s, double eps, BnRunning running, double* mean, double* invstd,
                     cudaStream_t stream) {
  if (s.C == 0) return;
  if (!supported(dt)) HT_UNSUPPORTED_DTYPE("batch_norm stats", dt);
  const bn::StatsArgs a{dt, x, s, eps, running, mean, invstd};
  // Channels last: the ticket kernels when they apply and find a ticket slot; else the split kernels.
  const bool done = s.N * s.S > 0 && s.S == 1 && cl_tickets_for(s.C) && bn::stats_cl2(a, stream);
  if (!done) bn::stats_split(a, stream);
  HT_CHECK_LAUNCH("batch_norm stats");
}

void launch_bn_normalize(DType dt, const void* x, BnShape s, BnChannels ch, void* y, cudaStream_t stream) {
  if (s.N * s.S * s.C == 0) return;
  if (!supported(dt)) HT_UNSUPPORTED_DTYPE("batch_norm", dt);
  const bn::NormalizeArgs a{dt, x, s, ch, y};
  bn::normalize_split(a, stream);
  HT_CHECK_LAUNCH("batch_norm");
}

void launch_bn_backward_reduce(DType dt, const void* g, const void* x, BnShape s, BnChannels ch, BnBackwardSums out,
                               cudaStream_t stream) {
  if (s.C == 0) return;
  if (!x) {  // (the caller passes x whenever ch.act masks g)
    out.sum_gxhat = nullptr;
    out.grad_weight = {};
    ch.act = BnAct::none;
  }
  if (!supported(dt)) HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  const bn::ReduceArgs a{dt, g, x, s, ch, out};
  // Channels last: the ticket kernels when they apply and find a ticket slot; else the split kernels.
  const bool done = s.N * s.S > 0 && s.S == 1 && cl_tickets_for(s.C) && bn::bwd_reduce_cl2(a, stream);
  if (!done) bn::bwd_reduce_split(a, stream);
  HT_CHECK_LAUNCH("batch_norm backward reduce");
}

void launch_bn_backward_dx(DType dt, BnMode mode, const void* g, const void* x, BnShape s, BnChannels ch,
                           const double* sum_g, const double* sum_gxhat, void* gx, cudaStream_t stream) {
  if (s.N * s.S * s.C == 0) return;
  if (mode == BnMode::eval && ch.act == BnAct::none) x = nullptr;
  if (!supported(dt)) HT_UNSUPPORTED_DTYPE("batch_norm backward", dt);
  const bn::DxArgs a{dt, mode, g, x, s, ch, sum_g, sum_gxhat, gx};
  bn::dx_split(a, stream);
  HT_CHECK_LAUNCH("batch_norm backward dx");
}

}  // namespace ht::kernels
