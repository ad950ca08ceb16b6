// Internal to src/cuda: what the cuBLASLt matrix products share. cublaslt_gemm.cpp (gemm(): f32, f64, bf16, f16)
// and gemm_lowp.cpp (gemm_lowp_nt(): int8, fp8) both keep their descriptors and chosen algorithm in the
// per-thread plan cache declared here; gemm_plan.cpp defines its out-of-line parts (the thread state,
// matrix layouts, the heuristic query, the HADATRAIN_GEMM_TUNE mode and running a plan, with its tuning).
//
// Note [GEMM plan cache]
// Creating descriptors and asking the heuristic costs tens of microseconds, so each thread keeps the
// descriptors and the chosen algorithm per key (device, dtypes, compute mode, sizes, transposes, leading
// dims, batch and strides, bias, and the pointer alignments the algorithm may rely on). When cuBLASLt
// offers no algorithm (a dtype or alignment it does not cover), a product without bias falls back to
// cublasGemmStridedBatchedEx.
//
// Note [GEMM algorithm tuning]
// cuBLASLt's heuristic ranks algorithms by a model, and its first choice is not always the fastest: on
// the H200 its fp8 pick for 8192x4096x11008 ran 8 % slower than PyTorch's _scaled_mm on the same cuBLASLt,
// and its fast-accumulation pick was slower than the precise one. So a plan asks the heuristic for up to
// kTuneCandidates algorithms (HADATRAIN_GEMM_TUNE_CANDIDATES asks for another count), and the first time the
// plan runs outside a CUDA graph capture (on the real operands, beta = 0 only: the timing runs overwrite C)
// each candidate runs once untimed and
// kTuneReps times between two events; the fastest is kept in the plan for every later call. That costs one
// host synchronisation per plan (the first call) and a few products' time. Which products are tuned is
// HADATRAIN_GEMM_TUNE (read once per process): `lowp` (the default: the fp8 and int8 products of
// gemm_lowp_nt), `all` (also gemm()'s f32/bf16/f16 products with beta = 0), `off` (the heuristic's first
// choice everywhere). A plan first made during a graph capture keeps the heuristic's choice, so a step
// graph and the eager steps before it run the same algorithm. Timing can pick different algorithms in
// different processes, whose results may differ in the last bits (different tile or split-k sums).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hadatrain/cuda/check.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/cuda/cublaslt_gemm.h"

namespace ht::cuda::gemm_detail {

// Note [GEMM algorithm tuning]
enum class Tune { off, lowp, all };
constexpr int kTuneCandidates = 8;
constexpr int kMaxTuneCandidates = 64;
constexpr int kTuneReps = 5;

// HADATRAIN_GEMM_TUNE, read once per process (gemm_plan.cpp).
Tune tune_mode();
// HADATRAIN_GEMM_TUNE_CANDIDATES (1 to kMaxTuneCandidates; default kTuneCandidates), read once per process.
int tune_candidates();

// A product's arguments in words, for error messages (cublaslt_gemm.cpp and gemm_lowp.cpp).
std::string describe(const GemmArgs& g);
std::string describe(const LowpGemmArgs& g);

// Runs f; a CudaError it throws is rethrown with the product's shape appended.
template <class G, class F>
void with_shape(const G& g, F&& f) {
  try {
    f();
  } catch (const CudaError& e) {
    throw CudaError(fmt::format("{} (in {})", e.what(), describe(g)), e.code());
  }
}

// Largest power of two (up to 256) dividing the address and every batch step of an operand.
inline uint32_t alignment(const void* p, int64_t stride_elems, std::size_t item, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1 && stride_elems != 0) bits |= static_cast<uint64_t>(stride_elems) * item;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;  // cuBLAS's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
  // The heuristic's other candidates, to be timed on the first call (Note [GEMM algorithm tuning]);
  // empty once tuned, or when tuning is off for this product.
  std::vector<cublasLtMatmulAlgo_t> candidates;
  ~Plan() {
    if (la) (void)cublasLtMatrixLayoutDestroy(la);
    if (lb) (void)cublasLtMatrixLayoutDestroy(lb);
    if (lc) (void)cublasLtMatrixLayoutDestroy(lc);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }
};

using Key = std::array<int64_t, 20>;

struct ThreadState {
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, std::unique_ptr<Plan>> lowp_plans;  // gemm_lowp_nt (Note [Low-precision GEMM])
  std::array<cublasHandle_t, kMaxDevices> blas{};  // fallback handles, created on first use
  ~ThreadState() {
    plans.clear();
    lowp_plans.clear();
    for (cublasHandle_t h : blas)
      if (h) (void)cublasDestroy(h);
  }
};

ThreadState& state();  // this thread's plans and fallback handles (gemm_plan.cpp)

constexpr std::size_t kMaxPlans = 512;

// The parts of a plan both products build the same way (gemm_plan.cpp).
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride);
// Asks the heuristic for the best algorithm of p's descriptors with these pointer alignments (cuBLAS's
// A, B, C, D); leaves p.has_algo false when there is none. With `tune`, and outside a graph capture, the
// heuristic's next candidates go into p.candidates (Note [GEMM algorithm tuning]).
void find_algo(Plan& plan, const std::array<uint32_t, 4>& align, bool tune);

// Runs p's product on `stream` with the plan's algorithm: cuBLASLt's D = C = alpha·(b)·(a) + beta·C in its
// column-major view of the row-major operands (Note [Row-major GEMM on column-major cuBLAS]) and the cuBLAS
// workspace; when p still has candidates, times them first and keeps the fastest (Note [GEMM algorithm tuning]).
struct PlanOperands {
  const void* alpha;  // host scalars of the plan's scale type
  const void* beta;
  const void* a;  // row-major A, B and C of the product (GemmArgs / LowpGemmArgs)
  const void* b;
  void* c;
};
void run_plan(Plan& p, const PlanOperands& o, cudaStream_t stream);

}  // namespace ht::cuda::gemm_detail
