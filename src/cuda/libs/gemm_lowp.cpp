// Low-precision cuBLASLt matrix products on raw device pointers (see cuda/cublaslt_gemm.h): gemm_lowp_nt() for
// int8 -> int32 and fp8 -> f32 / bf16, with scalar or outer-vector fp8 scales, zero-padded copies for
// operands cuBLASLt cannot take in place, and our fallback kernel (cuda/kernels/lowp_gemm.cuh). The plan cache and
// algorithm tuning it shares with cublaslt_gemm.cpp are in gemm_internal.h and gemm_plan.cpp.
//
// Note [Low-precision GEMM]
// gemm_lowp_nt computes row-major C (m, n) = a (m, k) · b (n, k)ᵀ in int8 (CUBLAS_COMPUTE_32I, int32
// alpha/beta, exact int32 accumulation) or fp8 (CUBLAS_COMPUTE_32F, f32 scale type, output f32 or bf16).
// With the swap of Note [Row-major GEMM on column-major cuBLAS], cuBLAS's A is our b read as col-major
// (k, n) and transposed, its B our a read as col-major (k, m) untransposed: exactly the "TN" layout that
// cuBLASLt's int8 (IMMA) and fp8 kernels require, with both operands K-contiguous. fp8 scales: cuBLAS's
// A_SCALE_POINTER is our scale_b, B_SCALE_POINTER our scale_a (f32 device pointers, read by the kernel; set
// on the cached descriptor before every call, so neither pointer nor value is part of the plan).
// CUBLASLT_MATMUL_DESC_FAST_ACCUM stays 0 unless Fp8Accum::fast is asked for: with it, Hopper fp8 kernels
// skip the periodic promotion of the tensor-core partial sums to full fp32 and lose accuracy for large k.
// Alignment: the fast path runs in place when k, lda and ldb are multiples of 16 elements (16 bytes), n and
// ldc are multiples of 16 bytes of the output, and every pointer and batch step is 16-byte aligned (the
// Tensor Core requirements of the cuBLAS documentation; int8 IMMA needs only multiples of 4, fp8 16 bytes).
// Otherwise the operands that miss them are copied (one kernel each, cuda/kernels/lowp_gemm.cu) into buffers of
// (m, round16(k)) and (round16(n), round16(k)) padded with zeros: zeros along k add exact zeros to every
// dot product and the extra rows of b only produce extra columns of a padded result, of which the (m, n)
// part is copied out. If cuBLASLt offers no algorithm even then, a simple one-thread-per-output kernel of
// ours runs instead (correct, slow). Nothing here synchronises with the host, except the one-time
// timing of Note [GEMM algorithm tuning].
#include "hadatrain/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <array>
#include <memory>

#include "gemm_internal.h"
#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/check.h"
#include "hadatrain/cuda/context.h"
#include "hadatrain/tensor/dtype.h"
#include "cuda/kernels/lowp_gemm.cuh"

namespace ht::cuda {
using namespace gemm_detail;

std::string gemm_detail::describe(const LowpGemmArgs& g) {
  return fmt::format("gemm_lowp_nt {} x {} -> {}: m {} n {} k {}, lda {} ldb {} ldc {}, batch {} (strides {} {} {}){}",
                     dtype_name(g.a_dtype), dtype_name(g.b_dtype), dtype_name(g.c_dtype), g.m, g.n, g.k, g.lda, g.ldb,
                     g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c,
                     g.accum == Fp8Accum::fast ? ", fast accumulation" : "");
}

namespace {

bool is_fp8(DType dt) { return dt == DType::f8e4m3 || dt == DType::f8e5m2; }

cudaDataType_t lowp_type(DType dt) {
  switch (dt) {
    case DType::i8: return CUDA_R_8I;
    case DType::i32: return CUDA_R_32I;
    case DType::f8e4m3: return CUDA_R_8F_E4M3;
    case DType::f8e5m2: return CUDA_R_8F_E5M2;
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    default: HT_FAIL("gemm_lowp_nt: dtype {} is not supported", dtype_name(dt));
  }
}

void check_lowp(const LowpGemmArgs& g) {
  const bool int8 = g.a_dtype == DType::i8 && g.b_dtype == DType::i8;
  const bool fp8 = is_fp8(g.a_dtype) && is_fp8(g.b_dtype);
  HT_CHECK(int8 || fp8,
           "gemm_lowp_nt: operands {} x {} are not supported (i8 x i8, or fp8 e4m3/e5m2 x e4m3/e5m2) in {}",
           dtype_name(g.a_dtype), dtype_name(g.b_dtype), describe(g));
  HT_CHECK(!(g.a_dtype == DType::f8e5m2 && g.b_dtype == DType::f8e5m2),
           "gemm_lowp_nt: f8e5m2 x f8e5m2 is not supported by cuBLASLt (one operand must be f8e4m3) in {}",
           describe(g));
  if (int8) {
    HT_CHECK(g.c_dtype == DType::i32, "gemm_lowp_nt: i8 x i8 products are i32, not {} ({})", dtype_name(g.c_dtype),
             describe(g));
    HT_CHECK(!g.scale_a && !g.scale_b && !g.row_scale_a && !g.col_scale_b && g.accum == Fp8Accum::precise,
             "gemm_lowp_nt: scales and accumulation modes are for fp8 products only ({})", describe(g));
  } else {
    HT_CHECK(g.c_dtype == DType::f32 || g.c_dtype == DType::bf16,
             "gemm_lowp_nt: fp8 products are written as f32 or bf16, not {} ({})", dtype_name(g.c_dtype), describe(g));
  }
  HT_CHECK((g.row_scale_a == nullptr) == (g.col_scale_b == nullptr),
           "gemm_lowp_nt: outer-vector scales come in pairs (row_scale_a and col_scale_b) in {}", describe(g));
  HT_CHECK(!g.row_scale_a || (!g.scale_a && !g.scale_b),
           "gemm_lowp_nt: scalar scales and outer-vector scales exclude each other in {}", describe(g));
  HT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "gemm_lowp_nt: negative size in {}", describe(g));
  HT_CHECK(g.lda >= std::max<int64_t>(1, g.k) && g.ldb >= std::max<int64_t>(1, g.k) &&
               g.ldc >= std::max<int64_t>(1, g.n),
           "gemm_lowp_nt: leading dims too small in {}", describe(g));
  HT_CHECK(g.batch <= INT32_MAX, "gemm_lowp_nt: batch count above 2^31-1 in {}", describe(g));
  HT_CHECK(g.stride_a >= 0 && g.stride_b >= 0 && g.stride_c >= 0, "gemm_lowp_nt: negative batch stride in {}",
           describe(g));
}

constexpr int64_t kLowpAlign = 16;  // bytes (and elements of the one-byte operands)
int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
bool aligned16(const void* p, int64_t stride_elems, std::size_t item, int64_t batch) {
  return alignment(p, stride_elems, item, batch) >= kLowpAlign;
}
bool a_in_place(const LowpGemmArgs& g) {
  return g.k % kLowpAlign == 0 && g.lda % kLowpAlign == 0 && aligned16(g.a, g.stride_a, 1, g.batch);
}
bool b_in_place(const LowpGemmArgs& g) {
  return g.k % kLowpAlign == 0 && g.n % kLowpAlign == 0 && g.ldb % kLowpAlign == 0 &&
         aligned16(g.b, g.stride_b, 1, g.batch);
}
bool c_in_place(const LowpGemmArgs& g) {
  const auto cs = static_cast<int64_t>(itemsize(g.c_dtype));
  return (g.n * cs) % kLowpAlign == 0 && (g.ldc * cs) % kLowpAlign == 0 &&
         aligned16(g.c, g.stride_c, itemsize(g.c_dtype), g.batch);
}

std::unique_ptr<Plan> make_lowp_plan(const LowpGemmArgs& g, const std::array<uint32_t, 4>& align) {
  auto p = std::make_unique<Plan>();
  const bool fp8 = is_fp8(g.a_dtype);
  HT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, fp8 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32I,
                                           fp8 ? CUDA_R_32F : CUDA_R_32I));
  const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;  // "TN" (Note [Low-precision GEMM])
  HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (fp8) {
    const int8_t fast = g.accum == Fp8Accum::fast ? 1 : 0;
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    // The heuristic sees whether scales are present; the pointers themselves are set before every call.
    // Outer-vector scales (Note [Low-precision GEMM]): cuBLAS's A is our b, so its A vector is our col_scale_b
    // (n values: cuBLAS's M) and its B vector our row_scale_a (m values: cuBLAS's N).
    const float* sa = g.row_scale_a ? g.col_scale_b : g.scale_b;
    const float* sb = g.row_scale_a ? g.row_scale_a : g.scale_a;
    if (g.row_scale_a) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
      HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    }
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  }
  // cuBLAS's A = our b: col-major (k, n) with ld ldb, transposed; its B = our a: col-major (k, m), ld lda.
  p->la = make_layout(lowp_type(g.b_dtype), g.k, g.n, g.ldb, g.batch, g.stride_b);
  p->lb = make_layout(lowp_type(g.a_dtype), g.k, g.m, g.lda, g.batch, g.stride_a);
  p->lc = make_layout(lowp_type(g.c_dtype), g.n, g.m, g.ldc, g.batch, g.stride_c);
  find_algo(*p, align, tune_mode() != Tune::off);
  return p;
}

Plan& lowp_plan_for(const LowpGemmArgs& g) {
  const std::size_t citem = itemsize(g.c_dtype);
  const std::array<uint32_t, 4> align = {alignment(g.b, g.stride_b, 1, g.batch), alignment(g.a, g.stride_a, 1, g.batch),
                                         alignment(g.c, g.stride_c, citem, g.batch),
                                         alignment(g.c, g.stride_c, citem, g.batch)};
  const Key key = {current_device(),
                   static_cast<int64_t>(g.a_dtype) * 256 + static_cast<int64_t>(g.b_dtype),
                   static_cast<int64_t>(g.c_dtype),
                   static_cast<int64_t>(g.accum),
                   g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c,
                   (g.scale_a ? 1 : 0) + (g.scale_b ? 2 : 0) + (g.row_scale_a ? 4 : 0),
                   align[0], align[1], align[2], 0, 0};
  auto& plans = state().lowp_plans;
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  if (plans.size() >= kMaxPlans) plans.clear();
  return *plans.emplace(key, make_lowp_plan(g, align)).first->second;
}

void run_lowp(Plan& p, const LowpGemmArgs& g, cudaStream_t stream) {
  const bool fp8 = is_fp8(g.a_dtype);
  if (fp8) {  // scales: device pointers, read by the kernel (never by the host); vectors as in make_lowp_plan
    const float* sa = g.row_scale_a ? g.col_scale_b : g.scale_b;
    const float* sb = g.row_scale_a ? g.row_scale_a : g.scale_a;
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
    HT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  }
  const int32_t ai = 1, bi = 0;
  const float af = 1.0f, bf = 0.0f;
  const void* alpha = fp8 ? static_cast<const void*>(&af) : &ai;
  const void* beta = fp8 ? static_cast<const void*>(&bf) : &bi;
  run_plan(p, {alpha, beta, g.a, g.b, g.c}, stream);
}

kernels::LowpKernelArgs kernel_args(const LowpGemmArgs& g) {
  kernels::LowpKernelArgs k;
  k.a_dtype = g.a_dtype;
  k.b_dtype = g.b_dtype;
  k.c_dtype = g.c_dtype;
  k.m = g.m;
  k.n = g.n;
  k.k = g.k;
  k.a = g.a;
  k.b = g.b;
  k.c = g.c;
  k.lda = g.lda;
  k.ldb = g.ldb;
  k.ldc = g.ldc;
  k.batch = g.batch;
  k.stride_a = g.stride_a;
  k.stride_b = g.stride_b;
  k.stride_c = g.stride_c;
  k.scale_a = g.scale_a;
  k.scale_b = g.scale_b;
  return k;
}

// Zero-padded copy of a (batch-strided) row-major one-byte operand: (count, rows, cols) with row stride ld
// into the dense (count, prows, pcols) buffer dst. count is 1 for an operand shared by all batches.
void padded_copy(const void* src, int64_t ld, int64_t stride, int64_t count, int64_t rows, int64_t cols, void* dst,
                 int64_t prows, int64_t pcols, cudaStream_t stream) {
  kernels::PadCopyArgs pc;
  pc.src = src;
  pc.src_ld = ld;
  pc.src_batch_stride = stride;
  pc.rows = rows;
  pc.cols = cols;
  pc.dst = dst;
  pc.dst_ld = pcols;
  pc.dst_batch_stride = prows * pcols;
  pc.dst_rows = prows;
  pc.dst_cols = pcols;
  pc.batch = count;
  pc.elem_bytes = 1;
  kernels::launch_pad_copy_2d(pc, stream);
}

LowpPath run_lowp_padded(const LowpGemmArgs& g, cudaStream_t stream) {
  const int64_t kp = round_up(g.k, kLowpAlign), np = round_up(g.n, kLowpAlign);
  const auto citem = static_cast<int64_t>(itemsize(g.c_dtype));
  const int64_t count_a = (g.batch > 1 && g.stride_a == 0) ? 1 : g.batch;
  const int64_t count_b = (g.batch > 1 && g.stride_b == 0) ? 1 : g.batch;
  // k % 16 != 0 pads both operands; b in place implies n % 16 == 0, so np == n unless b is padded.
  const bool pad_a = !a_in_place(g), pad_b = !b_in_place(g);
  const bool pad_c = np != g.n || !c_in_place(g);
  auto alloc = [](int64_t bytes) {
    return caching_allocator().allocate(static_cast<std::size_t>(bytes), Device::cuda(current_device()));
  };
  // Buffers first (dense, 256-byte aligned), so that the plan sees their real alignment before any copy.
  LowpGemmArgs p = g;
  p.k = kp;
  p.n = np;
  DataPtr a_buf, b_buf, c_buf;
  if (pad_a) {
    a_buf = alloc(count_a * g.m * kp);
    p.a = a_buf.get();
    p.lda = kp;
    p.stride_a = count_a > 1 ? g.m * kp : 0;
  }
  if (pad_b) {
    b_buf = alloc(count_b * np * kp);
    p.b = b_buf.get();
    p.ldb = kp;
    p.stride_b = count_b > 1 ? np * kp : 0;
  }
  if (pad_c) {
    c_buf = alloc(g.batch * g.m * np * citem);
    p.c = c_buf.get();
    p.ldc = np;
    p.stride_c = g.m * np;
  }
  Plan& plan = lowp_plan_for(p);
  if (!plan.has_algo) {  // no cuBLASLt kernel at all: ours, on the original operands
    kernels::launch_lowp_gemm_nt(kernel_args(g), stream);
    return LowpPath::kernel;
  }
  if (pad_a) padded_copy(g.a, g.lda, g.stride_a, count_a, g.m, g.k, a_buf.get(), g.m, kp, stream);
  if (pad_b) padded_copy(g.b, g.ldb, g.stride_b, count_b, g.n, g.k, b_buf.get(), np, kp, stream);
  run_lowp(plan, p, stream);
  if (pad_c) {
    kernels::PadCopyArgs out;
    out.src = p.c;
    out.src_ld = p.ldc;
    out.src_batch_stride = p.stride_c;
    out.rows = g.m;
    out.cols = g.n;
    out.dst = g.c;
    out.dst_ld = g.ldc;
    out.dst_batch_stride = g.stride_c;
    out.dst_rows = g.m;
    out.dst_cols = g.n;
    out.batch = g.batch;
    out.elem_bytes = static_cast<int>(citem);
    kernels::launch_pad_copy_2d(out, stream);
  }
  return LowpPath::cublaslt_padded;  // the buffers are freed in stream order after the queued work
}

}  // namespace

const char* lowp_path_name(LowpPath p) {
  switch (p) {
    case LowpPath::cublaslt: return "cublaslt";
    case LowpPath::cublaslt_padded: return "cublaslt_padded";
    case LowpPath::kernel: return "kernel";
    case LowpPath::trivial: return "trivial";
    case LowpPath::unsupported: return "unsupported";
  }
  return "?";
}

LowpPath gemm_lowp_nt(const LowpGemmArgs& g) {
  check_lowp(g);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return LowpPath::trivial;
  HT_CHECK(g.c && (g.k == 0 || (g.a && g.b)), "gemm_lowp_nt: null operand pointer in {}", describe(g));
  const cudaStream_t stream = current_stream();
  LowpPath path = LowpPath::trivial;
  with_shape(g, [&] {
    if (g.k == 0) {  // empty sums: zeros (all-zero bytes are 0 in i32, f32 and bf16)
      const std::size_t item = itemsize(g.c_dtype);
      for (int64_t i = 0; i < g.batch; ++i)
        HT_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(g.c) + i * g.stride_c * static_cast<int64_t>(item),
                                        g.ldc * item, 0, g.n * item, g.m, stream));
      return;
    }
    if (g.row_scale_a) {  // outer-vector scales: cuBLASLt in place, or nothing (the caller falls back)
      path = LowpPath::unsupported;
      if (g.impl == LowpImpl::fallback_kernel || g.batch != 1 || !a_in_place(g) || !b_in_place(g) || !c_in_place(g))
        return;
      Plan& p = lowp_plan_for(g);
      if (p.has_algo) {
        run_lowp(p, g, stream);
        path = LowpPath::cublaslt;
      }
      return;
    }
    if (g.impl == LowpImpl::fallback_kernel) {
      kernels::launch_lowp_gemm_nt(kernel_args(g), stream);
      path = LowpPath::kernel;
      return;
    }
    if (a_in_place(g) && b_in_place(g) && c_in_place(g)) {
      Plan& p = lowp_plan_for(g);
      if (p.has_algo) {
        run_lowp(p, g, stream);
        path = LowpPath::cublaslt;
        return;
      }
    }
    path = run_lowp_padded(g, stream);
  });
  return path;
}

}  // namespace ht::cuda
