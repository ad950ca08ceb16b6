// Row kernels (see rows.cuh): a group of `tpr` threads per row, tpr = 32 (a warp, 8 rows per 256-thread block)
// for rows of at most 256 elements and 256 (the whole block) otherwise. Every thread of a block runs the same
// number of row-group iterations, so the block-wide reductions may synchronise; threads past the last row
// reduce neutral values. Reductions combine the threads in a fixed order (deterministic), except the
// embedding scatter-add, which uses atomicAdd.
// This file: softmax / log_softmax (multi-pass and register-resident), cross-entropy, embedding and max /
// argmax. layer_norm / rms_norm: rows_norm.cu (with rows_norm_cached.cu, rows_norm_staged_fwd.cu and
// rows_norm_staged_bwd.cu); the shared helpers: rows_common.cuh, rows_launch.cuh.
#include <limits>
#include <type_traits>

#include "cuda/kernels/rows_common.cuh"

namespace ht::kernels {
namespace {
using namespace rk;

// ---- softmax / log_softmax -------------------------------------------------------------------------------

template <class T>
__global__ void softmax_kernel(T* out, const T* in, int64_t rows, int64_t len, int tpr, SoftmaxKind kind) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = in + row * len;
    A m = -std::numeric_limits<A>::infinity();
    if (valid)
      row_read(x, len, lane, tpr, [&](int64_t, T v) { m = d_max(m, convert<A>(v)); });
    m = group_reduce(m, tpr, smem, Max{});
    A s = A(0);
    if (valid)
      row_read(x, len, lane, tpr, [&](int64_t, T v) { s += soft_exp<T>(convert<A>(v) - m); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    const A log_s = d_log(s);
    T* y = out + row * len;
    row_write(y, x, len, lane, tpr, [&](int64_t, T v) {
      const A z = convert<A>(v) - m;
      return kind == SoftmaxKind::softmax ? soft_exp<T>(z) / s : z - log_s;
    });
  });
}

template <class T>
__global__ void softmax_backward_kernel(T* gx, const T* g, const T* y, int64_t rows, int64_t len, int tpr,
                                        SoftmaxKind kind) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const bool soft = kind == SoftmaxKind::softmax;
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* gr = g + row * len;
    const T* yr = y + row * len;
    A s = A(0);
    if (valid)
      row_read2(gr, yr, len, lane, tpr,
                [&](int64_t, T gv, T yv) { s += soft ? convert<A>(gv) * convert<A>(yv) : convert<A>(gv); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    T* out = gx + row * len;
    row_write2(out, gr, yr, len, lane, tpr, [&](int64_t, T gv, T yv) {
      const A gj = convert<A>(gv), yj = convert<A>(yv);
      return soft ? yj * (gj - s) : gj - soft_exp<T>(yj) * s;
    });
  });
}

// ---- register-resident softmax / log_softmax (the section "register-resident rows" of rows_common.cuh) ----
// The kind is a template parameter: a softmax keeps the exponentials (f64: the row) over the sum's reduction, a
// log_softmax the row (not the exponentials), which keeps either within 64 registers at NP = 4.
template <class T, int NP, SoftmaxKind K>
__global__ void __launch_bounds__(kCacheMaxTpr, NP == 4 ? 2 : 1) softmax_cached_kernel(T* out, const T* in, int64_t rows,
                                                                                      int64_t len, int tpr) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[2][kCacheMaxTpr / 32];
  const int packs = static_cast<int>(len / V);
  // Keeping e^(x - m) costs NP x V registers (bf16, NP = 4: 64 registers, four 256-thread blocks per SM;
  // recomputing them: 48 registers, five blocks, four more instructions per element). f64's exp needs the
  // registers itself: recomputed.
  constexpr bool kKeepExp = !std::is_same_v<T, double>;
  int phase = 0;
  for_each_cached_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    RowCache<T, NP> c;
    c.load(in + row * len, packs, lane, tpr);
    const A m = tile_reduce1(lane_max(c, packs, lane, tpr), tpr, smem, phase, Max{});
    A e[NP][V];  // e^(x - m), computed once for the sum and the softmax results (f64: twice, see kKeepExp)
    A s = A(0);
    auto exps = [&](auto&& ex) {
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        if (lane + i * tpr >= packs) continue;
        A x[V];
        unpack(c.p[i], x);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          e[i][k] = ex(x[k]);
          s += e[i][k];
        }
      }
    };
    // bf16 / f16 softmax with |m| < 2^23: e^(x - m) = 2^(x log2e - m log2e), one FFMA instead of a subtraction
    // and a multiplication. The rounding error d of m log2e (|d| <= 0.5: m log2e < 2^24) scales every e of the
    // row by the same 2^-d, which cancels in e / s, and keeps the max's e within [0.70, 1.42]; log_softmax uses
    // s itself and keeps (x - m) log2e.
    if constexpr (kHalfPack<T> && K == SoftmaxKind::softmax) {
      if (fabsf(m) < 8388608.0f) {
        const float ml = m * kLog2e;
        exps([&](float x) { return ex2_ftz(fmaf(x, kLog2e, -ml)); });
      } else {
        exps([&](float x) { return fwd_exp<T>(x - m); });
      }
    } else {
      exps([&](A x) { return fwd_exp<T>(x - m); });
    }
    s = tile_reduce1(s, tpr, smem, phase, Sum{});
    if (!valid) return;
    T* y = out + row * len;
    // Every e is in [0, 1.42] and the max's at least 0.70, so s > 0 and every result is finite, unless a NaN
    // or +inf entry (or a row of -inf) made some e, hence s, NaN: only such rows need pack_cast's NaN check.
    const bool finite = s == s;
    if constexpr (K == SoftmaxKind::softmax) {
      A inv;
      if constexpr (kHalfPack<T>) inv = fast_rcp(s);
      else inv = A(1) / s;
      auto f = [&](int i, A(&o)[V]) {
        if constexpr (kKeepExp) {
#pragma unroll
          for (int k = 0; k < V; ++k) o[k] = e[i][k] * inv;
        } else {
          unpack(c.p[i], o);
#pragma unroll
          for (int k = 0; k < V; ++k) o[k] = fwd_exp<T>(o[k] - m) * inv;
        }
      };
      if (finite || !kHalfPack<T>) store_packs<false, T, NP>(y, packs, lane, tpr, f);
      else store_packs<true, T, NP>(y, packs, lane, tpr, f);
    } else {
      A log_s;
      if constexpr (kHalfPack<T>) log_s = fast_log(s);
      else log_s = d_log(s);
      auto f = [&](int i, A(&o)[V]) {
        unpack(c.p[i], o);
#pragma unroll
        for (int k = 0; k < V; ++k) o[k] = (o[k] - m) - log_s;
      };
      if (finite || !kHalfPack<T>) store_packs<false, T, NP>(y, packs, lane, tpr, f);
      else store_packs<true, T, NP>(y, packs, lane, tpr, f);
    }
  });
}

template <class T, int NP>
__global__ void __launch_bounds__(kRowBlock) softmax_backward_cached_kernel(T* gx, const T* g, const T* y,
                                                                           int64_t rows, int64_t len, int tpr,
                                                                           SoftmaxKind kind) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  __shared__ A smem[kRowBlock / 32];
  const int packs = static_cast<int>(len / V);
  const bool soft = kind == SoftmaxKind::softmax;
  for_each_cached_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    RowCache<T, NP> cg, cy;
    cg.load(g + row * len, packs, lane, tpr);
    cy.load(y + row * len, packs, lane, tpr);
    A s = A(0);
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      if (lane + i * tpr >= packs) continue;
#pragma unroll
      for (int k = 0; k < V; ++k) s += soft ? convert<A>(cg.p[i].v[k]) * convert<A>(cy.p[i].v[k]) : convert<A>(cg.p[i].v[k]);
    }
    s = tile_reduce(s, tpr, smem, Sum{});
    if (!valid) return;
    T* out = gx + row * len;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int q = lane + i * tpr;
      if (q >= packs) continue;
      Pack<T, V> o;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const A gj = convert<A>(cg.p[i].v[k]), yj = convert<A>(cy.p[i].v[k]);
        o.v[k] = store_cast<T>(soft ? yj * (gj - s) : gj - soft_exp<T>(yj) * s);
      }
      reinterpret_cast<Pack<T, V>*>(out)[q] = o;
    }
  });
}

// ---- cross-entropy ---------------------------------------------------------------------------------------

template <class T>
__global__ void cross_entropy_kernel(CrossEntropyArgs a, int tpr) {
  using A = acc_t<T>;
  __shared__ A smem[kRowBlock / 32];
  const T* logits = static_cast<const T*>(a.logits);
  const int64_t c = a.classes;
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = logits + row * c;
    A m = -std::numeric_limits<A>::infinity(), total = A(0);
    if (valid)
      row_read(x, c, lane, tpr, [&](int64_t, T xv) {
        const A v = convert<A>(xv);
        m = d_max(m, v);
        total += v;
      });
    m = group_reduce(m, tpr, smem, Max{});
    total = group_reduce(total, tpr, smem, Sum{});
    A s = A(0);
    if (valid)
      row_read(x, c, lane, tpr, [&](int64_t, T v) { s += d_exp(convert<A>(v) - m); });
    s = group_reduce(s, tpr, smem, Sum{});
    if (!valid || lane != 0) return;
    const A lse = m + d_log(s);
    static_cast<A*>(a.lse)[row] = lse;
    const int64_t t = a.target[row];
    A loss = A(0);
    if (t != a.ignore_index) {
      if (t < 0 || t >= c) {
        atomicMax(&a.status[1], static_cast<unsigned long long>(a.rows - row));
      } else {
        atomicAdd(&a.status[0], 1ull);
        const A ls = static_cast<A>(a.label_smoothing);
        const A nll = lse - convert<A>(x[t]);
        const A smooth = lse - total / static_cast<A>(c);
        loss = (A(1) - ls) * nll + (ls > A(0) ? ls * smooth : A(0));
      }
    }
    static_cast<A*>(a.loss)[row] = loss;
  });
}

template <class T>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardArgs a, int tpr) {
  using A = acc_t<T>;
  const int64_t c = a.classes;
  const A ls = static_cast<A>(a.label_smoothing);
  const A uniform = ls / static_cast<A>(c);
  for_each_row(a.rows, tpr, [&](int64_t row, int lane, bool valid) {
    if (!valid) return;
    T* gx = static_cast<T*>(a.g_logits) + row * c;
    const T* x = static_cast<const T*>(a.logits) + row * c;
    const int64_t t = a.target[row];
    if (t == a.ignore_index) {
      for (int64_t j = lane; j < c; j += tpr) gx[j] = convert<T>(A(0));
      return;
    }
    const A scale = static_cast<const A*>(a.g)[row * a.g_stride] * static_cast<A>(a.g_scale);
    const A lse = static_cast<const A*>(a.lse)[row];
    row_write(gx, x, c, lane, tpr, [&](int64_t j, T v) {
      const A p = d_exp(convert<A>(v) - lse);
      const A q = (j == t ? A(1) - ls : A(0)) + uniform;
      return scale * (p - q);
    });
  });
}

// ---- embedding -------------------------------------------------------------------------------------------

template <class U>
__global__ void embedding_kernel(EmbeddingArgs a) {
  U* out = static_cast<U*>(a.out);
  const U* w = static_cast<const U*>(a.weight);
  for (int64_t k = blockIdx.x; k < a.n; k += gridDim.x) {
    const int64_t id = a.ids[k];
    const bool ok = id >= 0 && id < a.vocab;
    if (!ok && threadIdx.x == 0) atomicMax(&a.status[1], static_cast<unsigned long long>(a.n - k));
    for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) out[k * a.dim + j] = ok ? w[id * a.s0 + j * a.s1] : U(0);
  }
}

template <class T>
__global__ void embedding_backward_kernel(acc_t<T>* acc, const T* g, const int64_t* ids, int64_t n, int64_t dim) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    acc_t<T>* row = acc + ids[k] * dim;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(row + j, convert<acc_t<T>>(g[k * dim + j]));
  }
}

// ---- max / argmax ----------------------------------------------------------------------------------------

template <class T>
__global__ void max_kernel(T* values, int64_t* indices, const T* in, int64_t rows, int64_t len, int tpr) {
  using A = acc_t<T>;
  __shared__ Best<A> smem[kRowBlock / 32];
  for_each_row(rows, tpr, [&](int64_t row, int lane, bool valid) {
    const T* x = in + row * len;
    // -inf (not lowest()) for floats, so that a row of -inf still picks its first element
    Best<A> best{std::is_floating_point_v<A> ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest(),
                 std::numeric_limits<long long>::max()};
    if (valid)
      for (int64_t j = lane; j < len; j += tpr) best = better(best, Best<A>{convert<A>(x[j]), static_cast<long long>(j)});
    best = group_reduce(best, tpr, smem, Better{});
    if (!valid || lane != 0) return;
    indices[row] = best.i;
    if (values) values[row] = x[best.i];
  });
}

unsigned blocks_for_rows(int64_t n) {
  constexpr int64_t kMaxBlocks = 132 * 64;
  return static_cast<unsigned>(n < 1 ? 1 : (n > kMaxBlocks ? kMaxBlocks : n));
}

// Threads per block for a loop over D elements of a row: a multiple of 32, at most 256.
unsigned threads_for(int64_t dim) {
  const int64_t t = (dim + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

}  // namespace

void launch_softmax(DType dt, SoftmaxKind kind, void* out, const void* in, int64_t rows, int64_t len,
                    cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid g = row_grid(rows, len);
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (const CacheGrid cg = cache_grid(rows, len, kVec<T>, {out, in}); cg.np > 0) {
      constexpr SoftmaxKind kSoft = SoftmaxKind::softmax, kLog = SoftmaxKind::log_softmax;
      auto* kernel = kind == kSoft ? (cg.np == 4 ? softmax_cached_kernel<T, 4, kSoft> : softmax_cached_kernel<T, 8, kSoft>)
                                   : (cg.np == 4 ? softmax_cached_kernel<T, 4, kLog> : softmax_cached_kernel<T, 8, kLog>);
      kernel<<<cg.blocks, cg.block, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), rows, len, cg.tpr);
      HT_CHECK_LAUNCH("softmax_cached_kernel");
      return;
    }
    softmax_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), rows, len,
                                                         g.tpr, kind);
    HT_CHECK_LAUNCH("softmax_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_softmax", dt);
}

void launch_softmax_backward(DType dt, SoftmaxKind kind, void* gx, const void* g, const void* y, int64_t rows,
                             int64_t len, cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid grid = row_grid(rows, len);
  const bool ok = visit_kernel_float(dt, [&](auto tag) {
    using T = decltype(tag);
    if (const BwdGrid bg = bwd_grid(rows, len, kVec<T>, {gx, g, y}, 132 * 64); bg.np > 0) {
      auto* kernel = bg.np == 2 ? softmax_backward_cached_kernel<T, 2> : softmax_backward_cached_kernel<T, 4>;
      kernel<<<bg.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(gx), static_cast<const T*>(g),
                                                  static_cast<const T*>(y), rows, len, bg.tpr, kind);
      HT_CHECK_LAUNCH("softmax_backward_cached_kernel");
      return;
    }
    softmax_backward_kernel<T><<<grid.blocks, kRowBlock, 0, stream>>>(
        static_cast<T*>(gx), static_cast<const T*>(g), static_cast<const T*>(y), rows, len, grid.tpr, kind);
    HT_CHECK_LAUNCH("softmax_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_softmax_backward", dt);
}

void launch_cross_entropy(const CrossEntropyArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const RowGrid g = row_grid(a.rows, a.classes);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("cross_entropy_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_cross_entropy", a.dtype);
}

void launch_cross_entropy_backward(const CrossEntropyBackwardArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const RowGrid g = row_grid(a.rows, a.classes);
  const bool ok = visit_kernel_float(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(a, g.tpr);
    HT_CHECK_LAUNCH("cross_entropy_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_cross_entropy_backward", a.dtype);
}

void launch_embedding(const EmbeddingArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.dim == 0) return;
  const unsigned blocks = blocks_for_rows(a.n), threads = threads_for(a.dim);
  switch (a.itemsize) {
    case 1: embedding_kernel<uint8_t><<<blocks, threads, 0, stream>>>(a); break;
    case 2: embedding_kernel<uint16_t><<<blocks, threads, 0, stream>>>(a); break;
    case 4: embedding_kernel<uint32_t><<<blocks, threads, 0, stream>>>(a); break;
    case 8: embedding_kernel<unsigned long long><<<blocks, threads, 0, stream>>>(a); break;
    default: HT_UNSUPPORTED_DTYPE("launch_embedding (itemsize)", static_cast<DType>(a.itemsize));
  }
  HT_CHECK_LAUNCH("embedding_kernel");
}

void launch_embedding_backward(DType g_dtype, void* acc, const void* g, const int64_t* ids, int64_t n, int64_t dim,
                               cudaStream_t stream) {
  if (n == 0 || dim == 0) return;
  const unsigned blocks = blocks_for_rows(n), threads = threads_for(dim);
  const bool ok = visit_kernel_float(g_dtype, [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<acc_t<T>*>(acc),
                                                                 static_cast<const T*>(g), ids, n, dim);
    HT_CHECK_LAUNCH("embedding_backward_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_embedding_backward", g_dtype);
}

void launch_max(DType dt, void* values, int64_t* indices, const void* x, int64_t rows, int64_t len,
                cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  const RowGrid g = row_grid(rows, len);
  const bool ok = visit_compute_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    max_kernel<T><<<g.blocks, kRowBlock, 0, stream>>>(static_cast<T*>(values), indices, static_cast<const T*>(x), rows,
                                                     len, g.tpr);
    HT_CHECK_LAUNCH("max_kernel");
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_max", dt);
}

}  // namespace ht::kernels
