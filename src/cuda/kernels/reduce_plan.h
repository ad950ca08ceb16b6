// Host-side planning of sum/mean reductions (see reduce.cuh): the input viewed as kept x reduced index sets,
// and the launch plan. No CUDA headers, so the CPU tests check this logic (tests/cpu/test_kernel_layout.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "hadatrain/tensor/dtype_enum.h"
#include "cuda/kernels/kernel_layout.h"

namespace ht::kernels {

// A set of dims (outermost first) with their element strides; index i decomposes row-major over them.
struct IndexSet {
  int ndim = 0;
  int64_t count = 1;  // product of sizes
  int64_t size[kMaxDims] = {};
  FastDiv div[kMaxDims];
  int64_t stride[kMaxDims] = {};
};

// Element offset of index i of the set (row-major over its dims).
HT_DEV int64_t offset_in(const IndexSet& s, int64_t i) {
  if (s.ndim == 1) return i * s.stride[0];
  if (s.ndim == 0) return 0;
  int64_t off = 0;
  if (s.count < (int64_t{1} << 31)) {
    uint32_t r = static_cast<uint32_t>(i);
    for (int d = s.ndim - 1; d > 0; --d) {
      const uint32_t q = s.div[d].div(r);
      off += static_cast<int64_t>(r - q * static_cast<uint32_t>(s.size[d])) * s.stride[d];
      r = q;
    }
    return off + static_cast<int64_t>(r) * s.stride[0];
  }
  for (int d = s.ndim - 1; d > 0; --d) {
    const int64_t q = i / s.size[d];
    off += (i - q * s.size[d]) * s.stride[d];
    i = q;
  }
  return off + i * s.stride[0];
}

struct ReduceLayout {
  IndexSet kept;     // m: the output's elements, in the order of the contiguous output
  IndexSet reduced;  // k
};

// Keeps non-trivial dims (outermost first), merging a dim into the previous one when they are contiguous.
inline IndexSet make_index_set(int n, const int64_t* size, const int64_t* stride) {
  IndexSet s;
  for (int j = 0; j < n; ++j) {
    if (size[j] == 1) continue;
    if (s.ndim > 0 && s.stride[s.ndim - 1] == stride[j] * size[j]) {  // contiguous with the previous dim
      s.size[s.ndim - 1] *= size[j];
      s.stride[s.ndim - 1] = stride[j];
      continue;
    }
    s.size[s.ndim] = size[j];
    s.stride[s.ndim] = stride[j];
    ++s.ndim;
  }
  s.count = 1;
  for (int j = 0; j < n; ++j) s.count *= size[j];
  for (int j = 0; j < s.ndim; ++j)
    s.div[j] = FastDiv(s.size[j] > 0 && s.size[j] < (int64_t{1} << 31) ? static_cast<uint32_t>(s.size[j]) : 1u);
  return s;
}

// Splits the input's dims by `reduced[d]`, drops size-1 dims and merges contiguous neighbours.
inline ReduceLayout make_reduce_layout(int ndim, const int64_t* shape, const int64_t* strides, const bool* reduced) {
  int64_t ks[kMaxDims], kst[kMaxDims], rs[kMaxDims], rst[kMaxDims];
  int nk = 0, nr = 0;
  for (int d = 0; d < ndim; ++d) {
    if (reduced[d]) {
      rs[nr] = shape[d];
      rst[nr++] = strides[d];
    } else {
      ks[nk] = shape[d];
      kst[nk++] = strides[d];
    }
  }
  return {make_index_set(nk, ks, kst), make_index_set(nr, rs, rst)};
}

enum class ReduceMode : uint8_t {
  rows,     // the reduced index is the fast one: a warp or a block per output element
  columns,  // the kept index is the fast one: a warp's lanes cover 32 neighbouring outputs
};

struct SumPlan {
  ReduceMode mode = ReduceMode::rows;
  int threads_per_row = 256;     // rows mode: 32 or 256
  int splits = 1;                // blocks sharing one output's reduction (then a second pass adds them)
  int64_t chunk = 0;             // reduced positions per split
  std::size_t workspace_bytes = 0;  // partial sums when splits > 1
};

inline constexpr int kSumTargetBlocks = 132 * 8;  // enough blocks to keep an H200's 132 SMs busy
inline constexpr int kSumMaxSplits = 1024;

// Bytes of the accumulator type of a sum over dtype (float, double or int64).
inline std::size_t sum_acc_bytes(DType dt) {
  switch (dt) {
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::f8e4m3:
    case DType::f8e5m2: return 4;
    default: return 8;  // f64: double; integers and bool: int64
  }
}

// Chooses the mode, the threads per row and the split of the reduced range (host code, unit-tested on the CPU).
inline SumPlan plan_sum(DType dtype, const ReduceLayout& l) {
  SumPlan p;
  const int64_t M = l.kept.count, K = l.reduced.count;
  const bool kept_fast = l.kept.ndim > 0 && l.kept.stride[l.kept.ndim - 1] == 1;
  const bool reduced_fast = l.reduced.ndim > 0 && l.reduced.stride[l.reduced.ndim - 1] == 1;
  p.mode = kept_fast && !reduced_fast ? ReduceMode::columns : ReduceMode::rows;
  int64_t blocks = 0, per_split_min = 0;
  if (p.mode == ReduceMode::rows) {
    // A block per row only when there are too few rows to keep the GPU busy with a warp per row: many
    // short-lived blocks (one 16 KB row each) stalled on their block-wide reduction left the row sums at
    // about 0.67 of copy bandwidth; a warp streaming its row with four 16-byte loads in flight does not.
    p.threads_per_row = (M < 1024 || (K >= 2048 && M < 8 * kSumTargetBlocks)) ? 256 : 32;
    blocks = (M + (256 / p.threads_per_row) - 1) / (256 / p.threads_per_row);
    per_split_min = static_cast<int64_t>(p.threads_per_row) * 8;  // at least 8 elements per thread
  } else {
    blocks = (M + 31) / 32;
    per_split_min = 8 * 8;
  }
  int64_t splits = 1;
  if (blocks < kSumTargetBlocks && K > per_split_min) {
    splits = (kSumTargetBlocks + blocks - 1) / blocks;
    const int64_t by_work = K / per_split_min;
    if (splits > by_work) splits = by_work;
    if (splits > kSumMaxSplits) splits = kSumMaxSplits;
    if (splits < 1) splits = 1;
  }
  p.chunk = K > 0 ? (K + splits - 1) / splits : 0;
  if (splits > 1) p.chunk = (p.chunk + 15) / 16 * 16;  // split starts stay 16-byte aligned (vectorized loads)
  p.splits = K > 0 ? static_cast<int>((K + p.chunk - 1) / p.chunk) : 1;
  p.workspace_bytes = p.splits > 1 ? static_cast<std::size_t>(p.splits) * static_cast<std::size_t>(M) * sum_acc_bytes(dtype) : 0;
  return p;
}

}  // namespace ht::kernels
