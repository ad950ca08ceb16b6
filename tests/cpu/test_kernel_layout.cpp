// Host-side index math of the CUDA kernels, checked on the CPU: FastDiv, the elementwise Layout (dims
// dropped and merged, offsets of every operand), and the reduction plan (every input element visited
// exactly once, outputs in row-major order of the kept dims, splits that cover the reduced range).
#include "support/catch.h"

#include <algorithm>
#include <random>
#include <vector>

#include "cuda/kernels/kernel_layout.h"
#include "cuda/kernels/reduce_plan.h"

using namespace ht;
using namespace ht::kernels;

namespace {

// Row-major offsets of linear index i over `shape` with `strides` (the definition offsets_of must match).
int64_t naive_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t i) {
  int64_t off = 0;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    off += (i % shape[static_cast<std::size_t>(d)]) * strides[static_cast<std::size_t>(d)];
    i /= shape[static_cast<std::size_t>(d)];
  }
  return off;
}

}  // namespace

TEST_CASE("FastDiv divides like integer division", "[kernels][layout]") {
  std::mt19937_64 rng(1);
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 7, 10, 31, 32, 33, 1000, 4099, 65535, 65536, 65537, 1u << 20,
                                    (1u << 31) - 1, 1u << 30, 3u << 29};
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<uint32_t>(rng() % ((1u << 31) - 1)) + 1);
  for (uint32_t d : divisors) {
    const FastDiv f(d);
    std::vector<uint32_t> ns = {0, 1, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - d};
    for (int i = 0; i < 200; ++i) ns.push_back(static_cast<uint32_t>(rng() % (1u << 31)));
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      INFO("n " << n << " d " << d);
      REQUIRE(f.div(n) == n / d);
    }
  }
}

TEST_CASE("Layout drops size-1 dims, merges contiguous dims and gives every operand's offsets", "[kernels][layout]") {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 400; ++trial) {
    const int nd = static_cast<int>(rng() % 6);
    std::vector<int64_t> shape(static_cast<std::size_t>(nd));
    for (auto& s : shape) s = static_cast<int64_t>(rng() % 5);  // sizes 0..4 (0 and 1 included)
    if (trial % 3 == 0)
      for (auto& s : shape) s = std::max<int64_t>(s, 1);
    // operand 0: contiguous; operand 1: a permutation of a contiguous layout; operand 2: broadcast dims.
    std::vector<std::vector<int64_t>> st(3, std::vector<int64_t>(static_cast<std::size_t>(nd)));
    int64_t run = 1;
    for (int d = nd - 1; d >= 0; --d) {
      st[0][static_cast<std::size_t>(d)] = run;
      run *= std::max<int64_t>(shape[static_cast<std::size_t>(d)], 1);
    }
    std::vector<int> perm(static_cast<std::size_t>(nd));
    for (int d = 0; d < nd; ++d) perm[static_cast<std::size_t>(d)] = d;
    std::shuffle(perm.begin(), perm.end(), rng);
    run = 1;
    for (int j = nd - 1; j >= 0; --j) {
      const int d = perm[static_cast<std::size_t>(j)];
      st[1][static_cast<std::size_t>(d)] = run;
      run *= std::max<int64_t>(shape[static_cast<std::size_t>(d)], 1);
    }
    for (int d = 0; d < nd; ++d)
      st[2][static_cast<std::size_t>(d)] = rng() % 2 ? 0 : static_cast<int64_t>(rng() % 7) + 1;
    const int64_t* ptrs[3] = {st[0].data(), st[1].data(), st[2].data()};
    const Layout<3> l = make_layout<3>(nd, shape.data(), ptrs);
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    REQUIRE(l.numel == numel);
    REQUIRE(l.ndim <= nd);
    for (int d = 0; d < l.ndim; ++d) REQUIRE(l.size[d] != 1);  // size-1 dims dropped
    for (int64_t i = 0; i < numel; ++i) {
      int64_t off[3];
      offsets_of(l, i, off);
      for (int k = 0; k < 3; ++k) {
        INFO("trial " << trial << " operand " << k << " index " << i);
        REQUIRE(off[k] == naive_offset(shape, st[static_cast<std::size_t>(k)], i));
      }
    }
  }
}

TEST_CASE("Layout recognises dense operands as flat", "[kernels][layout]") {
  const int64_t shape[3] = {4, 5, 6}, dense[3] = {30, 6, 1}, trans[3] = {1, 4, 20}, bcast[3] = {0, 6, 1};
  const int64_t* same2[2] = {dense, dense};
  const Layout<2> flat = make_layout<2>(3, shape, same2);
  CHECK(flat.flat());
  CHECK(flat.ndim == 1);
  CHECK(flat.size[0] == 120);
  const int64_t* mixed[2] = {dense, trans};
  CHECK_FALSE(make_layout<2>(3, shape, mixed).flat());
  const int64_t* broadcast[2] = {dense, bcast};
  const Layout<2> b = make_layout<2>(3, shape, broadcast);
  CHECK_FALSE(b.flat());
  CHECK(b.ndim == 2);  // (4) x (30): the inner two dims merge for both operands
  const int64_t one[1] = {1}, scalar_shape[1] = {1};
  const int64_t* s1[1] = {one};
  CHECK(make_layout<1>(1, scalar_shape, s1).flat());
  CHECK(make_layout<1>(0, scalar_shape, s1).flat());  // 0-d
}

TEST_CASE("a reduction layout visits every input element once, outputs in row-major order", "[kernels][reduce]") {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = static_cast<int>(rng() % 5) + 1;
    std::vector<int64_t> shape(static_cast<std::size_t>(nd));
    for (auto& s : shape) s = static_cast<int64_t>(rng() % 5) + 1;
    // a permuted, possibly step-sliced layout
    std::vector<int> perm(static_cast<std::size_t>(nd));
    for (int d = 0; d < nd; ++d) perm[static_cast<std::size_t>(d)] = d;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> strides(static_cast<std::size_t>(nd));
    int64_t run = trial % 2 ? 2 : 1;
    for (int j = nd - 1; j >= 0; --j) {
      const int d = perm[static_cast<std::size_t>(j)];
      strides[static_cast<std::size_t>(d)] = run;
      run *= shape[static_cast<std::size_t>(d)];
    }
    bool reduced[kMaxDims] = {};
    for (int d = 0; d < nd; ++d) reduced[d] = rng() % 2;
    const ReduceLayout l = make_reduce_layout(nd, shape.data(), strides.data(), reduced);
    int64_t total = 1;
    for (int64_t s : shape) total *= s;
    REQUIRE(l.kept.count * l.reduced.count == total);
    // kept dims in order: output m corresponds to the row-major index over the kept dims
    std::vector<int64_t> kshape, kstride, rshape, rstride;
    for (int d = 0; d < nd; ++d) {
      (reduced[d] ? rshape : kshape).push_back(shape[static_cast<std::size_t>(d)]);
      (reduced[d] ? rstride : kstride).push_back(strides[static_cast<std::size_t>(d)]);
    }
    std::vector<int64_t> visited;
    for (int64_t m = 0; m < l.kept.count; ++m) {
      REQUIRE(offset_in(l.kept, m) == naive_offset(kshape, kstride, m));
      for (int64_t k = 0; k < l.reduced.count; ++k) visited.push_back(offset_in(l.kept, m) + offset_in(l.reduced, k));
    }
    for (int64_t k = 0; k < l.reduced.count; ++k) REQUIRE(offset_in(l.reduced, k) == naive_offset(rshape, rstride, k));
    std::sort(visited.begin(), visited.end());
    REQUIRE(std::adjacent_find(visited.begin(), visited.end()) == visited.end());  // each element once
  }
}

TEST_CASE("the sum plan covers the reduced range and picks the coalesced mode", "[kernels][reduce]") {
  struct Case {
    std::vector<int64_t> shape, strides;
    std::vector<bool> reduced;
    ReduceMode mode;
  };
  const std::vector<Case> cases = {
      {{1000003}, {1}, {true}, ReduceMode::rows},                    // full reduction
      {{3, 300007}, {300007, 1}, {false, true}, ReduceMode::rows},   // long rows
      {{100003, 7}, {7, 1}, {false, true}, ReduceMode::rows},        // short rows
      {{65537, 33}, {33, 1}, {true, false}, ReduceMode::columns},    // bias gradient
      {{33, 65537}, {1, 33}, {false, true}, ReduceMode::columns},    // transposed view, reduce the strided dim
      {{129, 7, 257}, {1799, 257, 1}, {true, false, true}, ReduceMode::rows},
      {{5, 0}, {1, 1}, {false, true}, ReduceMode::rows},             // empty reduction
  };
  for (const Case& c : cases) {
    bool mask[kMaxDims] = {};
    for (std::size_t d = 0; d < c.reduced.size(); ++d) mask[d] = c.reduced[d];
    const ReduceLayout l = make_reduce_layout(static_cast<int>(c.shape.size()), c.shape.data(), c.strides.data(), mask);
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i8}) {
      const SumPlan p = plan_sum(dt, l);
      const int64_t K = l.reduced.count, M = l.kept.count;
      INFO("shape size " << c.shape.size() << " M " << M << " K " << K);
      CHECK(p.mode == c.mode);
      CHECK(p.splits >= 1);
      CHECK(p.splits <= kSumMaxSplits);
      if (K > 0) {
        CHECK(p.chunk * p.splits >= K);          // the splits cover the range
        CHECK(p.chunk * (p.splits - 1) < K);     // and none is empty
      }
      CHECK(p.workspace_bytes == (p.splits > 1 ? static_cast<std::size_t>(p.splits * M) * sum_acc_bytes(dt) : 0));
      CHECK((p.threads_per_row == 32 || p.threads_per_row == 256));
    }
  }
  // Few outputs over a long range are split; many outputs are not.
  const int64_t big[1] = {1 << 24}, unit[1] = {1};
  bool all[kMaxDims] = {true};
  CHECK(plan_sum(DType::f32, make_reduce_layout(1, big, unit, all)).splits > 100);
  const int64_t rows_shape[2] = {1 << 20, 64}, rows_strides[2] = {64, 1};
  bool last[kMaxDims] = {false, true};
  CHECK(plan_sum(DType::f32, make_reduce_layout(2, rows_shape, rows_strides, last)).splits == 1);
}
