// HLA, the Hadamard low-rank approximation of the g_w path (include/hadatrain/grad/hla.h, hlq.md §4): the
// plan (block size and kept Walsh rows) and the blockwise projection x (B, L, C) -> f32 (B, R, C) or
// (B, C, R). CPU reference here; the CUDA branch (cuda/glue/hla_glue.cpp, cuda/kernels/hla.cu) computes the same
// bits: inputs converted to f32, the butterfly of Note [Bit-identical quantisation] in f32, kept rows copied.
#include "hadatrain/grad/hla.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/tensor/factory.h"
#include "ops/cpu/convert.h"
#include "ops/cpu/loops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/hla_glue.h"
#endif

namespace ht::grad {
namespace {

// The butterfly of Note [Bit-identical quantisation] step 2 (f32, stages h = 1, 2, ..., n/2) along the rows of one
// block buf (n, C), channels contiguous, for every channel.
void butterfly_block(std::vector<float>& buf, int64_t n, int64_t C) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t j = 0; j < n; ++j) {
      if ((j / h) % 2 != 0) continue;
      float* a = &buf[static_cast<std::size_t>(j * C)];
      float* e = &buf[static_cast<std::size_t>((j + h) * C)];
      for (int64_t c = 0; c < C; ++c) {
        const float u = a[c], v = e[c];
        a[c] = u + v;
        e[c] = u - v;
      }
    }
}

int log2_exact(int64_t n) {
  int m = 0;
  while ((int64_t{1} << m) < n) ++m;
  return m;
}

// s = 2^⌊log₄ n⌋ for n = 2^m: the side of the largest square s² <= n.
int64_t side_of(int64_t n) { return int64_t{1} << (log2_exact(n) / 2); }

// Natural Hadamard index of sequency row j of S_n (n = 2^m): bitrev_m(j XOR (j >> 1)).
int32_t natural_of(int64_t j, int m) {
  const uint64_t g = static_cast<uint64_t>(j ^ (j >> 1));
  uint64_t r = 0;
  for (int b = 0; b < m; ++b)
    if (g & (uint64_t{1} << b)) r |= uint64_t{1} << (m - 1 - b);
  return static_cast<int32_t>(r);
}

void check_rank(const HlaRank& rank) {
  if (rank.kind == HlaRank::Kind::percentile)
    HT_CHECK(rank.pct > 0.0 && rank.pct <= 50.0,
             "hla_plan: percentile pct must be in (0, 50], got {} (pct > 50 makes the reference select duplicated, "
             "overlapping rows, hlq.md §7 #3; use HlaRank::Kind::rows for larger ranks)",
             rank.pct);
  if (rank.kind == HlaRank::Kind::rows)
    HT_CHECK(rank.rows >= 1, "hla_plan: HlaRank::Kind::rows needs rows >= 1, got {}", rank.rows);
}

// Sequency indices kept for a block of n = 2^m (n >= 1), ascending.
std::vector<int32_t> sequency_rows(int64_t n, const HlaRank& rank) {
  check_rank(rank);
  std::vector<int32_t> seq;
  if (n == 1) return {0};
  const int64_t s = side_of(n);
  switch (rank.kind) {
    case HlaRank::Kind::full:
      for (int64_t j = 0; j < n; ++j) seq.push_back(static_cast<int32_t>(j));
      break;
    case HlaRank::Kind::percentile: {
      // hlq.md §4.4: sf = trunc(0.1·(10s + 5 − sqrt(2·s²·pct + 25))), 0 <= sf < s for pct in (0, 50].
      const double sd = static_cast<double>(s);
      const int64_t sf = static_cast<int64_t>(std::trunc(0.1 * (10.0 * sd + 5.0 - std::sqrt(2.0 * sd * sd * rank.pct + 25.0))));
      HT_ASSERT(sf >= 0 && sf < s, "hla_plan: sf = {} out of [0, {}) for pct {}", sf, s, rank.pct);
      for (int64_t i = 0; i < s; ++i) {
        const int64_t keep = s - i - sf;
        if (keep <= 0) continue;
        const int64_t first = (i % 2 == 0) ? 0 : s - keep;  // even groups: first rows; odd: last rows
        for (int64_t j = first; j < first + keep; ++j) seq.push_back(static_cast<int32_t>(i * s + j));
      }
      break;
    }
    case HlaRank::Kind::rows: {
      HT_CHECK(rank.rows <= s * s,
               "hla_plan: HlaRank::Kind::rows = {} exceeds s² = {} for block n = {} (s = {}: only 2-D sequencies "
               "(u, v) with u, v < s are eligible)",
               rank.rows, s * s, n, s);
      // The first `rows` pairs (u, v) in the order (u + v, then u); sequency index u·s + (v or s−1−v).
      int64_t taken = 0;
      for (int64_t d = 0; d <= 2 * (s - 1) && taken < rank.rows; ++d)
        for (int64_t u = 0; u < s && taken < rank.rows; ++u) {
          const int64_t v = d - u;
          if (v < 0 || v >= s) continue;
          seq.push_back(static_cast<int32_t>(u * s + (u % 2 == 0 ? v : s - 1 - v)));
          ++taken;
        }
      std::sort(seq.begin(), seq.end());
      break;
    }
  }
  return seq;
}

// The plan checks hla_project and hla_project_unfolded share: x (what) has L positions.
void check_plan(const char* op, const std::string& what, int64_t L, const HlaPlan& plan) {
  const int64_t n = plan.block, r = plan.kept();
  HT_CHECK(L == plan.length, "{}: {} has L = {}, but the plan is for L = {} ({})", op, what, L, plan.length,
           plan.describe());
  HT_CHECK(n >= 1 && (n & (n - 1)) == 0 && L % n == 0 && r >= 1 && r <= n,
           "{}: invalid plan {} (block must be a power of two dividing L, 1 <= r <= n)", op, plan.describe());
  for (int32_t k : plan.rows)
    HT_CHECK(k >= 0 && k < n, "{}: plan {} lists natural row {} outside [0, {})", op, plan.describe(), k, n);
}


}  // namespace

std::string HlaPlan::describe() const {
  const double pct = block > 0 ? 100.0 * static_cast<double>(kept()) / static_cast<double>(block) : 0.0;
  return fmt::format("L {}: n {}, r {} ({:.1f} %)", length, block, kept(), pct);
}

int64_t hla_block_for(int64_t length) {
  HT_CHECK(length >= 1, "hla_block_for: length must be >= 1, got {}", length);
  return length & -length;
}

std::vector<int32_t> hla_sequency_rows(int64_t block, const HlaRank& rank) {
  HT_CHECK(block >= 1 && (block & (block - 1)) == 0, "hla_sequency_rows: block must be a power of two, got {}",
           block);
  return sequency_rows(block, rank);
}

HlaPlan hla_plan(int64_t length, const HlaRank& rank) {
  HT_CHECK(length >= 1, "hla_plan: length L must be >= 1, got {}", length);
  HlaPlan plan;
  plan.length = length;
  plan.block = hla_block_for(length);
  const int m = log2_exact(plan.block);
  for (int32_t j : sequency_rows(plan.block, rank)) plan.rows.push_back(natural_of(j, m));
  return plan;
}

Tensor hla_project(const Tensor& x, const HlaPlan& plan, HlaLayout layout, Tensor* absmax) {
  HT_CHECK(x.dim() == 3, "hla_project: x must be (B, L, C), got {}", x.describe());
  check_floating("hla_project", {&x});
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2);
  const int64_t n = plan.block, r = plan.kept();
  check_plan("hla_project", "x " + x.describe(), L, plan);
  const int64_t P = L / n, R = P * r;
  Tensor out = empty(layout == HlaLayout::rows ? Shape{B, R, C} : Shape{B, C, R}, {DType::f32, x.device()});
  if (x.is_cuda()) {
#ifdef HADATRAIN_CUDA
    if (absmax) *absmax = zeros({1}, {DType::f32, x.device()});  // the kernel's atomic maxima start at 0
    cuda_ops::hla_project(out, x, plan, layout, absmax ? static_cast<float*>(absmax->data_ptr()) : nullptr);
    return out;
#else
    no_cuda_kernel("hla_project");
#endif
  }
  if (absmax) *absmax = zeros({1});
  if (out.numel() == 0) return out;
  const int64_t sb = x.strides()[0], sl = x.strides()[1], sc = x.strides()[2];
  float* po = cpu::ptr<float>(out);
  visit_floating(x.dtype(), "hla_project", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = cpu::ptr<T>(x);
    std::vector<float> buf(static_cast<std::size_t>(n * C));  // one block: (n, C), channels contiguous
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = 0; c < C; ++c)
            buf[static_cast<std::size_t>(t * C + c)] = cpu::convert<float>(px[b * sb + (p * n + t) * sl + c * sc]);
        butterfly_block(buf, n, C);
        for (int64_t i = 0; i < r; ++i) {
          const float* src = &buf[static_cast<std::size_t>(plan.rows[static_cast<std::size_t>(i)] * C)];
          if (layout == HlaLayout::rows) {
            float* dst = po + (b * R + p * r + i) * C;  // (B, R, C)
            for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
          } else {
            float* dst = po + b * C * R + p * r + i;  // (B, C, R)
            for (int64_t c = 0; c < C; ++c) dst[c * R] = src[c];
          }
        }
      }
  });
  if (absmax) {
    float m = 0.0f;
    for (int64_t i = 0; i < out.numel(); ++i) m = std::fmax(m, std::fabs(po[i]));
    *absmax = from_vector(std::vector<float>{m}, {1});
  }
  return out;
}

Tensor hla_project_unfolded(const Tensor& image, const Unfold2dParams& window, const HlaPlan& plan, HlaLayout layout,
                            Tensor* absmax) {
  HT_CHECK(image.dim() == 4, "hla_project_unfolded: image must be (N, C, H, W), got {}", image.describe());
  if (image.is_cuda()) {  // read through the im2col index map, never materialising the columns
#ifdef HADATRAIN_CUDA
    check_floating("hla_project_unfolded", {&image});
    const auto [OH, OW] = unfold2d_grid("hla_project_unfolded", image.size(2), image.size(3), window);
    check_plan("hla_project_unfolded", fmt::format("image {} ({}x{} output grid)", image.describe(), OH, OW), OH * OW,
               plan);
    const int64_t N = image.size(0), K = image.size(1) * window.kernel_h * window.kernel_w;
    const int64_t R = OH * OW / plan.block * plan.kept();
    Tensor out = empty(layout == HlaLayout::rows ? Shape{N, R, K} : Shape{N, K, R}, {DType::f32, image.device()});
    if (absmax) *absmax = zeros({1}, {DType::f32, image.device()});  // the kernel's atomic maxima start at 0
    cuda_ops::hla_project_unfolded(out, image.detach(), window, plan, layout,
                                   absmax ? static_cast<float*>(absmax->data_ptr()) : nullptr);
    return out;
#else
    no_cuda_kernel("hla_project_unfolded");
#endif
  }
  return hla_project(unfold2d(image, window), plan, layout, absmax);
}

Tensor hla_back_project(const Tensor& g, const HlaPlan& plan, double mult, DType out_dtype) {
  HT_CHECK(g.dim() == 3, "hla_back_project: g must be (B, R, C), got {}", g.describe());
  check_floating("hla_back_project", {&g});
  HT_CHECK(is_floating(out_dtype) && out_dtype != DType::f8e4m3 && out_dtype != DType::f8e5m2,
           "hla_back_project: the output dtype must be f32, f64, bf16 or f16, got {}", dtype_name(out_dtype));
  const int64_t B = g.size(0), C = g.size(2), n = plan.block, r = plan.kept(), L = plan.length;
  check_plan("hla_back_project", "the plan", L, plan);
  HT_CHECK(g.size(1) == L / n * r, "hla_back_project: g {} does not match the plan {} (expected (B, {}, C))",
           g.describe(), plan.describe(), L / n * r);
  Tensor out = empty({B, L, C}, {out_dtype, g.device()});
  if (out.numel() == 0) return out;
  const auto m = static_cast<float>(mult);
  if (g.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::hla_back_project(out, g, plan, m);
    return out;
#else
    no_cuda_kernel("hla_back_project");
#endif
  }
  const int64_t P = L / n;
  const int64_t sb = g.strides()[0], sr = g.strides()[1], sc = g.strides()[2];
  visit_floating(g.dtype(), "hla_back_project", [&](auto in_tag) {
    using I = typename decltype(in_tag)::type;
    const I* pg = cpu::ptr<I>(g);
    visit_floating(out_dtype, "hla_back_project", [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      O* po = cpu::ptr<O>(out);
      std::vector<float> buf(static_cast<std::size_t>(n * C));  // one block: (n, C), channels contiguous
      for (int64_t b = 0; b < B; ++b)
        for (int64_t p = 0; p < P; ++p) {
          std::fill(buf.begin(), buf.end(), 0.0f);
          for (int64_t i = 0; i < r; ++i) {
            float* dst = &buf[static_cast<std::size_t>(plan.rows[static_cast<std::size_t>(i)] * C)];
            for (int64_t c = 0; c < C; ++c) dst[c] = cpu::convert<float>(pg[b * sb + (p * r + i) * sr + c * sc]);
          }
          butterfly_block(buf, n, C);  // the projection's
          O* dst = po + (b * L + p * n) * C;
          for (int64_t t = 0; t < n * C; ++t) dst[t] = cpu::convert<O>(buf[static_cast<std::size_t>(t)] * m);
        }
    });
  });
  return out;
}

}  // namespace ht::grad
