// The cuBLASLt plumbing shared by cublaslt_gemm.cpp and gemm_lowp.cpp (declared in gemm_internal.h): the per-thread
// plan cache (Note [GEMM plan cache]), matrix layouts, the heuristic query, the HADATRAIN_GEMM_TUNE mode and
// run_plan, which times a plan's candidates the first time it runs (Note [GEMM algorithm tuning]).
#include <cstdlib>
#include <cstring>

#include "gemm_internal.h"

namespace ht::cuda::gemm_detail {

Tune tune_mode() {
  static const Tune mode = [] {
    const char* v = std::getenv("HADATRAIN_GEMM_TUNE");
    if (!v || !*v || std::strcmp(v, "lowp") == 0) return Tune::lowp;
    if (std::strcmp(v, "all") == 0) return Tune::all;
    if (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0) return Tune::off;
    HT_FAIL("HADATRAIN_GEMM_TUNE={} is not a tuning mode (lowp, all or off)", v);
  }();
  return mode;
}

int tune_candidates() {
  static const int n = [] {
    const char* v = std::getenv("HADATRAIN_GEMM_TUNE_CANDIDATES");
    if (!v || !*v) return kTuneCandidates;
    char* end = nullptr;
    const long k = std::strtol(v, &end, 10);
    if (*end != '\0' || k < 1 || k > kMaxTuneCandidates)
      HT_FAIL("HADATRAIN_GEMM_TUNE_CANDIDATES={} is not a count of algorithms from 1 to {}", v, kMaxTuneCandidates);
    return static_cast<int>(k);
  }();
  return n;
}

ThreadState& state() {
  thread_local ThreadState s;
  return s;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  HT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    HT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    HT_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

void find_algo(Plan& plan, const std::array<uint32_t, 4>& align, bool tune) {
  Plan* p = &plan;
  cublasLtMatmulPreference_t pref = nullptr;
  HT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { (void)cublasLtMatmulPreferenceDestroy(p); }
  } pref_guard{pref};
  const uint64_t ws = kCublasWorkspaceBytes;
  HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    HT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[static_cast<std::size_t>(i)],
                                                         sizeof(uint32_t)));
  if (tune) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HT_CUDA_CHECK(cudaStreamIsCapturing(current_stream(), &capture));
    tune = capture == cudaStreamCaptureStatusNone;
  }
  std::array<cublasLtMatmulHeuristicResult_t, kMaxTuneCandidates> results{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), p->desc, p->la, p->lb, p->lc, p->lc,
                                                           pref, tune ? tune_candidates() : 1, results.data(), &found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    p->algo = results[0].algo;
    p->has_algo = true;
    for (int i = 1; i < found; ++i)
      if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
        p->candidates.push_back(results[static_cast<std::size_t>(i)].algo);
  } else if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_SUCCESS) {
    HT_CUBLAS_CHECK(st);  // a real failure (not "no algorithm")
  }
}

namespace {

// Note [GEMM algorithm tuning]: run(algo) issues the product with that algorithm on `stream` and returns
// cuBLASLt's status. Times the heuristic's first choice and every candidate, keeps the fastest in
// p.algo and clears p.candidates. A candidate that fails to launch is skipped.
template <class Run>
void tune_plan(Plan& p, cudaStream_t stream, Run&& run) {
  std::vector<cublasLtMatmulAlgo_t> all{p.algo};
  all.insert(all.end(), p.candidates.begin(), p.candidates.end());
  p.candidates.clear();
  cudaEvent_t start = nullptr, stop = nullptr;
  HT_CUDA_CHECK(cudaEventCreate(&start));
  struct EventGuard {
    cudaEvent_t& a;
    cudaEvent_t& b;
    ~EventGuard() {
      if (a) (void)cudaEventDestroy(a);
      if (b) (void)cudaEventDestroy(b);
    }
  } guard{start, stop};
  HT_CUDA_CHECK(cudaEventCreate(&stop));
  // Work queued on other streams (a side branch: Note [Side branches] in tensor/side_branch.h) would run during
  // the timing and favour whichever candidate it slowed least: let it finish first. Tuning happens once per
  // plan, outside recordings.
  HT_CUDA_CHECK(cudaDeviceSynchronize());
  float best_ms = 0.0f;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (run(all[i]) != CUBLAS_STATUS_SUCCESS) continue;  // untimed warm-up; a candidate that cannot run drops out
    HT_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kTuneReps; ++r) HT_CUBLAS_CHECK(run(all[i]));
    HT_CUDA_CHECK(cudaEventRecord(stop, stream));
    HT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    HT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i == 0 || ms < best_ms) {
      best_ms = ms;
      p.algo = all[i];
    }
  }
}

}  // namespace

void run_plan(Plan& p, const PlanOperands& o, cudaStream_t stream) {
  const Workspace ws = cublas_workspace();
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(cublaslt_handle(), p.desc, o.alpha, o.b, p.la, o.a, p.lb, o.beta, o.c, p.lc, o.c, p.lc, &algo,
                          ws.ptr, ws.bytes, stream);
  };
  if (!p.candidates.empty()) tune_plan(p, stream, run);
  HT_CUBLAS_CHECK(run(p.algo));
}

}  // namespace ht::cuda::gemm_detail
