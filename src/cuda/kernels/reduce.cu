// Sum/mean reduction kernels (see reduce.cuh). Rows mode: each output element is reduced by one warp
// (short rows) or one 256-thread block (long rows) walking the reduced index, with 16-byte loads and four
// loads in flight per thread when the reduced dim is contiguous and aligned; columns mode: a 32x8
// block covers 32 neighbouring outputs and 8 lanes of the reduced index, so loads stay coalesced when
// the kept dim is the contiguous one (e.g. the bias gradient, a sum over the batch). When there are too
// few outputs to fill the GPU, the reduced range is split over blockIdx.y, partial sums go to a
// workspace (splits x M) and a finalize kernel adds them in a fixed order.
#include "cuda/kernels/map.cuh"
#include "cuda/kernels/reduce.cuh"

namespace ht::kernels {
namespace {

template <class T>
using out_t = std::conditional_t<is_float_like_v<T>, T, int64_t>;


template <class A>
HT_DEV A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Stores the result for output m: the final value (one split) or a partial sum.
template <class T, class A>
HT_DEV void store_result(A acc, int64_t m, int split, int splits, int64_t M, A scale, out_t<T>* out, A* partial) {
  if (splits == 1) out[m] = convert<out_t<T>>(acc * scale);
  else partial[static_cast<int64_t>(split) * M + m] = acc;
}

// This lane's share of the contiguous range x[0, len) (x 16-byte aligned) with 16-byte loads, four packs in
// flight per iteration, four accumulators combined in a fixed order.
template <class T>
HT_DEV acc_t<T> sum_contiguous(const T* x, int64_t len, int lane, int tpr) {
  using A = acc_t<T>;
  constexpr int V = kVec<T>;
  using P = Pack<T, V>;
  const P* xv = reinterpret_cast<const P*>(x);
  const int64_t nv = len / V;
  A a0 = A(0), a1 = A(0), a2 = A(0), a3 = A(0);
  int64_t j = lane;
  for (; j + 3 * tpr < nv; j += 4 * tpr) {
    const P p0 = xv[j], p1 = xv[j + tpr], p2 = xv[j + 2 * tpr], p3 = xv[j + 3 * tpr];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      a0 += convert<A>(p0.v[k]);
      a1 += convert<A>(p1.v[k]);
      a2 += convert<A>(p2.v[k]);
      a3 += convert<A>(p3.v[k]);
    }
  }
  for (; j < nv; j += tpr) {
    const P p0 = xv[j];
#pragma unroll
    for (int k = 0; k < V; ++k) a0 += convert<A>(p0.v[k]);
  }
  for (int64_t k = nv * V + lane; k < len; k += tpr) a1 += convert<A>(x[k]);
  return (a0 + a1) + (a2 + a3);
}

// vec: every row of the reduced range is contiguous and 16-byte aligned at its start and at every split's
// start (checked on the host), so lanes read 16-byte packs.
template <class T>
__global__ void sum_rows_kernel(const T* in, ReduceLayout l, int tpr, int splits, int64_t chunk, acc_t<T> scale,
                                out_t<T>* out, acc_t<T>* partial, bool vec) {
  using A = acc_t<T>;
  __shared__ A warp_part[8];
  const int rows_per_block = blockDim.x / tpr;
  const int row_in_block = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  const int64_t M = l.kept.count, K = l.reduced.count;
  const int split = blockIdx.y;
  const int64_t k0 = split * chunk, k1 = k0 + chunk < K ? k0 + chunk : K;
  const int64_t groups = (M + rows_per_block - 1) / rows_per_block;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t m = g * rows_per_block + row_in_block;
    A acc = A(0);
    if (m < M) {
      const T* base = in + offset_in(l.kept, m);
      if (vec) {
        acc = sum_contiguous(base + k0, k1 - k0, lane, tpr);
      } else if (l.reduced.ndim <= 1) {
        const int64_t st = l.reduced.ndim == 1 ? l.reduced.stride[0] : 0;
#pragma unroll 4
        for (int64_t k = k0 + lane; k < k1; k += tpr) acc += convert<A>(base[k * st]);
      } else {
        for (int64_t k = k0 + lane; k < k1; k += tpr) acc += convert<A>(base[offset_in(l.reduced, k)]);
      }
    }
    acc = warp_sum(acc);
    if (tpr > 32) {  // one row per block: combine the 8 warps
      if (lane % 32 == 0) warp_part[lane / 32] = acc;
      __syncthreads();
      if (lane < 32) {
        acc = lane < blockDim.x / 32 ? warp_part[lane] : A(0);
        acc = warp_sum(acc);
      }
      __syncthreads();
    }
    if (lane == 0 && m < M) store_result<T, A>(acc, m, split, splits, M, scale, out, partial);
  }
}

// 32 x 8 block: threadIdx.x picks the output, threadIdx.y a lane of the reduced index.
template <class T>
__global__ void sum_columns_kernel(const T* in, ReduceLayout l, int splits, int64_t chunk, acc_t<T> scale,
                                   out_t<T>* out, acc_t<T>* partial) {
  using A = acc_t<T>;
  __shared__ A part[8][33];
  const int64_t M = l.kept.count, K = l.reduced.count;
  const int64_t m = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int split = blockIdx.y;
  const int64_t k0 = split * chunk, k1 = k0 + chunk < K ? k0 + chunk : K;
  A acc = A(0);
  if (m < M) {
    const T* base = in + offset_in(l.kept, m);
    for (int64_t k = k0 + threadIdx.y; k < k1; k += 8) acc += convert<A>(base[offset_in(l.reduced, k)]);
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && m < M) {
#pragma unroll
    for (int y = 1; y < 8; ++y) acc += part[y][threadIdx.x];
    store_result<T, A>(acc, m, split, splits, M, scale, out, partial);
  }
}

// Adds the `splits` partial sums of each output (in split order) and stores scale * total.
template <class T>
__global__ void sum_finalize_kernel(const acc_t<T>* partial, int64_t M, int splits, acc_t<T> scale, out_t<T>* out) {
  using A = acc_t<T>;
  __shared__ A part[8][33];
  const int64_t m = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A acc = A(0);
  if (m < M)
    for (int s = threadIdx.y; s < splits; s += 8) acc += partial[static_cast<int64_t>(s) * M + m];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && m < M) {
#pragma unroll
    for (int y = 1; y < 8; ++y) acc += part[y][threadIdx.x];
    out[m] = convert<out_t<T>>(acc * scale);
  }
}

// Rows mode may read 16-byte packs: the reduced range is one contiguous dim, the input pointer, every kept
// position and every split start are multiples of a pack.
template <class T>
bool rows_vectorizable(const ReduceLayout& l, const SumPlan& p, const T* in) {
  constexpr int V = kVec<T>;
  if (l.reduced.ndim != 1 || l.reduced.stride[0] != 1 || !aligned_to(in, 16)) return false;
  for (int d = 0; d < l.kept.ndim; ++d)
    if (l.kept.stride[d] % V != 0) return false;
  return p.splits == 1 || p.chunk % V == 0;
}

template <class F>
bool visit_reduce_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f8e4m3: f(f8e4m3{}); return true;
    case DType::f8e5m2: f(f8e5m2{}); return true;
    case DType::b8: f(bool{}); return true;
    default: return visit_compute_dtype(dt, f);
  }
}



}  // namespace



void launch_sum(const SumArgs& a, const SumPlan& p, void* workspace, cudaStream_t stream) {
  const int64_t M = a.layout.kept.count, K = a.layout.reduced.count;
  if (M == 0) return;
  const bool ok = visit_reduce_dtype(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    auto* out = static_cast<out_t<T>*>(a.out);
    auto* partial = static_cast<A*>(workspace);
    const A scale = static_cast<A>(a.scale);
    const dim3 cols_block(32, 8);
    if (K == 0) {  // empty reduction: every output is 0 (times scale, as on the CPU)
      sum_finalize_kernel<T><<<dim3(static_cast<unsigned>((M + 31) / 32)), cols_block, 0, stream>>>(nullptr, M, 0,
                                                                                                    scale, out);
      HT_CHECK_LAUNCH("sum_finalize_kernel");
      return;
    }
    const T* in = static_cast<const T*>(a.in);
    if (p.mode == ReduceMode::rows) {
      const int64_t groups = (M + (256 / p.threads_per_row) - 1) / (256 / p.threads_per_row);
      const dim3 grid(static_cast<unsigned>(groups < 65535 * 4 ? groups : 65535 * 4), static_cast<unsigned>(p.splits));
      sum_rows_kernel<T><<<grid, 256, 0, stream>>>(in, a.layout, p.threads_per_row, p.splits, p.chunk, scale, out,
                                                   partial, rows_vectorizable(a.layout, p, in));
      HT_CHECK_LAUNCH("sum_rows_kernel");
    } else {
      const dim3 grid(static_cast<unsigned>((M + 31) / 32), static_cast<unsigned>(p.splits));
      sum_columns_kernel<T><<<grid, cols_block, 0, stream>>>(in, a.layout, p.splits, p.chunk, scale, out, partial);
      HT_CHECK_LAUNCH("sum_columns_kernel");
    }
    if (p.splits > 1) {
      sum_finalize_kernel<T><<<dim3(static_cast<unsigned>((M + 31) / 32)), cols_block, 0, stream>>>(
          partial, M, p.splits, scale, out);
      HT_CHECK_LAUNCH("sum_finalize_kernel");
    }
  });
  if (!ok) HT_UNSUPPORTED_DTYPE("launch_sum", a.dtype);
}

}  // namespace ht::kernels
