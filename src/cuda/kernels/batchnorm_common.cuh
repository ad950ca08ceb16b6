// Device helpers shared by the batch-norm kernels (batchnorm_launch.cuh; the layouts and the arithmetic are
// described at the top of batchnorm.cu): pack loads and stores, warp / block / column sums, the index walk of
// the split grids, the per-channel constants and per-element maps of the forward and of dx, and the
// finalisation of a channel's partial sums (statistics, backward sums; the ticket of the channels-first
// reductions). The helpers are HT_DEV (__forceinline__): each kernel compiles as when they shared its file.
#pragma once
#include <cstring>

#include "cuda/kernels/batchnorm_launch.cuh"

namespace ht::kernels::bn {

// Arithmetic type of the per-element work: float for the 16-bit types, double otherwise.
template <class T>
using bn_t = std::conditional_t<sizeof(T) == 2, float, double>;

template <class T, int V>
HT_DEV Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <class T, int V>
HT_DEV void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}
// 16-byte packs moved as uint4 (one 16-byte load / store instruction whatever the element type's copy
// lowering; narrower packs as they are).
template <class T, int V>
HT_DEV Pack<T, V> plane_load(const T* p) {
  if constexpr (sizeof(Pack<T, V>) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    Pack<T, V> v;
    memcpy(&v, &u, 16);
    return v;
  } else {
    return load_pack<T, V>(p);
  }
}
// Note [Batch-norm 16-byte stores]
// NVVM lowers a Pack store in the channels-first normalize and dx kernels (bf16 / f16) to eight 2-byte
// st.global.u16, and even a plain uint4 store to st.global.v2.u16 (the address's alignment gets lost through the
// index arithmetic): the kernels were L2-bound on 8x the write sectors. The 16-byte store is therefore spelled
// in PTX; the bits are those of the element stores (H200, bf16 256x64x32x32, ms forward / backward: 0.1026 /
// 0.1037 with element stores, 0.0351 / 0.0515 with these, 0.674 / 0.765 of copy).
template <class T, int V>
HT_DEV void plane_store(T* p, const Pack<T, V>& v) {
  if constexpr (sizeof(Pack<T, V>) == 16) {
    uint4 u;
    memcpy(&u, &v, 16);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
  } else {
    store_pack<T, V>(p, v);
  }
}
// VS: 16-byte packs with plane_store (Note [Batch-norm 16-byte stores]; the channels-first kernels); else
// store_pack.
template <bool VS, class T, int V>
HT_DEV void cf_store(T* p, const Pack<T, V>& v) {
  if constexpr (VS) plane_store<T, V>(p, v);
  else store_pack<T, V>(p, v);
}
template <BnAct Act, class T, int V>
HT_DEV Pack<T, V> plane_res(const BnChannels& ch, int64_t o) {
  if constexpr (Act == BnAct::add_relu) return plane_load<T, V>(static_cast<const T*>(ch.residual) + o);
  else return Pack<T, V>{};
}

template <class T, class A>
HT_DEV T bn_store(A v) {
  return store_cast<T>(v);
}

HT_DEV double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a 1-D block of kThreads threads; thread 0 gets the result.
HT_DEV double block_sum(double v, double* scratch /* 32 */) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = 0.0;
  if (warp == 0) {
    v = lane < kThreads / 32 ? scratch[lane] : 0.0;
    v = warp_sum(v);
  }
  return v;
}

// Channels-last column sums: adds s1 and s2 (V values each) over the blockDim.y threads of every column
// (a fixed tree over threadIdx.y, all V values per step) and writes them as double to part (splits, 2, C)
// at split blockIdx.y, channels cv * V ... Every thread of the block must call it.
template <class A, int V>
HT_DEV void column_sums_to(const A (&s1)[V], const A (&s2)[V], A* red /* [2][V][kThreads] */, int64_t cv,
                           int64_t CV, int64_t C, double* part) {
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int tid = ty * TX + tx;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    red[(0 * V + j) * kThreads + tid] = s1[j];
    red[(1 * V + j) * kThreads + tid] = s2[j];
  }
  __syncthreads();
  int top = 1;
  while (top < TY) top <<= 1;
  for (int st = top / 2; st > 0; st >>= 1) {
    if (ty < st && ty + st < TY) {
#pragma unroll
      for (int j = 0; j < 2 * V; ++j) red[j * kThreads + tid] += red[j * kThreads + tid + st * TX];
    }
    __syncthreads();
  }
  if (ty == 0 && cv < CV) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t c = cv * V + j;
      part[(static_cast<int64_t>(blockIdx.y) * 2) * C + c] = static_cast<double>(red[(0 * V + j) * kThreads + tx]);
      part[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * C + c] = static_cast<double>(red[(1 * V + j) * kThreads + tx]);
    }
  }
}

// Element offset of pack j (of channel c) in x (N, C, S).
HT_DEV int64_t cf_offset(const BnShape& s, const CfGrid& g, int64_t c, int64_t j, int V) {
  int64_t n, sv;
  if (g.fast) {
    const uint32_t q = g.div_sv.div(static_cast<uint32_t>(j));
    n = q;
    sv = j - static_cast<int64_t>(q) * g.SV;
  } else {
    n = j / g.SV;
    sv = j - n * g.SV;
  }
  return (n * s.C + c) * s.S + sv * V;
}

// The items first + k * step (k >= 0) below hi of one thread, two at a time (two(i, j) loads both before
// computing) and a last single one, walking the block's units of `step` items (unit u = [lo + u * step,
// lo + (u + 1) * step), first - lo < step) from the top down, so that an elementwise pass after a reduction
// over the same range first reads what the reduction read last (still in L2).
template <class Two, class One>
HT_DEV void walk(int64_t lo, int64_t first, int64_t hi, int64_t step, Two two, One one) {
  int64_t u = (hi - lo + step - 1) / step - 1;  // the top unit (possibly partial)
  for (; u >= 1; u -= 2) {
    const int64_t i = first + u * step;
    if (i < hi) two(i, i - step);
    else one(i - step);
  }
  if (u == 0 && first < hi) one(first);
}

// ---- per-channel constants ------------------------------------------------------------------------------

// Value c of a per-channel parameter as double, or dflt when absent.
HT_DEV double param_at(const BnParam& p, int64_t c, double dflt) {
  if (!p.data) return dflt;
  switch (p.dtype) {
    case DType::f64: return static_cast<const double*>(p.data)[c];
    case DType::bf16: return to_double(static_cast<const bf16*>(p.data)[c]);
    case DType::f16: return to_double(static_cast<const f16*>(p.data)[c]);
    default: return to_double(static_cast<const float*>(p.data)[c]);
  }
}
HT_DEV void param_store(void* data, DType dt, int64_t c, double v) {
  switch (dt) {
    case DType::f64: static_cast<double*>(data)[c] = v; break;
    case DType::bf16: static_cast<bf16*>(data)[c] = convert<bf16>(v); break;
    case DType::f16: static_cast<f16*>(data)[c] = convert<f16>(v); break;
    default: static_cast<float*>(data)[c] = convert<float>(v); break;
  }
}

// y = x * scale + shift.
HT_DEV void affine_of(const BnChannels& ch, int64_t c, double& scale, double& shift) {
  const double w = param_at(ch.weight, c, 1.0), b = param_at(ch.bias, c, 0.0);
  scale = ch.invstd[c] * w;
  shift = b - ch.mean[c] * scale;
}

// The forward's per-element map before the activation, one explicit fma so that forward and backward (which
// recomputes it for the ReLU mask) round identically.
template <class A>
HT_DEV A bn_affine(A x, A scale, A shift) {
  if constexpr (std::is_same_v<A, float>) return __fmaf_rn(x, scale, shift);
  else return __fma_rn(x, scale, shift);
}
// The value the activation sees: round(x * scale + shift), plus the residual r (add_relu) added as the add op
// does (in acc_t<T>, rounded to T).
template <BnAct Act, class T, class A>
HT_DEV T bn_pre(A x, A scale, A shift, T r) {
  const T y = bn_store<T>(bn_affine(x, scale, shift));
  if constexpr (Act == BnAct::add_relu) {
    using R = acc_t<T>;
    return store_cast<T>(convert<R>(y) + convert<R>(r));
  } else {
    return y;
  }
}
// The forward's output element: act(bn_pre).
template <BnAct Act, class T, class A>
HT_DEV T bn_out(A x, A scale, A shift, T r) {
  const T y = bn_pre<Act, T>(x, scale, shift, r);
  if constexpr (Act != BnAct::none) {
    const A v = convert<A>(y);
    return (v > A(0) || v != v) ? y : T(0.0f);  // NaN propagates, as relu does
  } else {
    return y;
  }
}
// g times the fused relu's derivative (bn_pre > 0 ? 1 : 0), a product as relu's own backward forms it (so a
// non-finite g gives the same NaN).
template <BnAct Act, class T, class A>
HT_DEV A bn_masked_g(A g, A x, A scale, A shift, T r) {
  if constexpr (Act != BnAct::none) return g * (convert<A>(bn_pre<Act, T>(x, scale, shift, r)) > A(0) ? A(1) : A(0));
  else return g;
}
// The residual's pack at element offset o (add_relu), or zeros.
template <BnAct Act, class T, int V>
HT_DEV Pack<T, V> load_res(const BnChannels& ch, int64_t o) {
  if constexpr (Act == BnAct::add_relu) return load_pack<T, V>(static_cast<const T*>(ch.residual) + o);
  else return Pack<T, V>{};
}

// gx = g * a + (x - m) * b + k (train) or g * a (eval; b = k = 0).
struct DxCoef {
  double a, b, k, m;
};
HT_DEV DxCoef dx_coef_of(BnMode mode, const BnChannels& ch, const double* sum_g, const double* sum_gxhat,
                         double inv_m, int64_t c) {
  const double w = param_at(ch.weight, c, 1.0), is = ch.invstd[c];
  DxCoef r{w * is, 0.0, 0.0, 0.0};
  if (mode == BnMode::train) {
    r.b = -w * is * is * sum_gxhat[c] * inv_m;
    r.k = -w * is * sum_g[c] * inv_m;
    r.m = ch.mean[c];
  }
  return r;
}

// ---- finalisation of a channel ---------------------------------------------------------------------------

// Adds the partial sums of channel c (one warp per channel, lanes over the splits, a fixed order).
HT_DEV void finalize_sums(const double* part, int splits, int64_t C, int64_t c, double& a1, double& a2) {
  const int lane = threadIdx.x % 32;
  a1 = 0.0;
  a2 = 0.0;
  // __ldcg: written by other blocks of the same kernel (Fin). Unrolled: 8 loads of a lane in flight, added
  // in the same order.
#pragma unroll 8
  for (int y = lane; y < splits; y += 32) {
    a1 += __ldcg(part + (static_cast<int64_t>(y) * 2) * C + c);
    a2 += __ldcg(part + (static_cast<int64_t>(y) * 2 + 1) * C + c);
  }
  a1 = warp_sum(a1);
  a2 = warp_sum(a2);
}

// The ticket: called by every thread of a block after thread 0 wrote the block's partial sums of
// channel c; true in every thread of the last block of the channel to get here, which has reset the ticket
// for the next launch. The fences order the partial-sum stores before the ticket and the last block's reads
// after it (the threadFenceReduction pattern).
HT_DEV bool last_block_of_channel(unsigned* tickets, int64_t c) {
  __shared__ bool last;
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    const unsigned t = atomicAdd(tickets + c, 1u);
    last = t == gridDim.y - 1;
    if (last) {
      tickets[c] = 0u;  // every block of this launch has taken its ticket
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

// Channel c's statistics from its sums a1, a2 of (x - k) and (x - k)^2 (one thread).
HT_DEV void stats_write(double a1, double a2, double k, int64_t M, double eps, const BnRunning& running, double* mean,
                        double* invstd, int64_t c) {
  const double m = static_cast<double>(M);
  const double d = a1 / m;
  double var = a2 / m - d * d;  // biased
  if (var < 0.0) var = 0.0;
  const double mu = k + d;
  mean[c] = mu;
  invstd[c] = 1.0 / sqrt(var + eps);
  if (running.mean) {
    const double mo = running.momentum, unbias = m / (m - 1.0);
    const double rm = param_at(BnParam{running.mean, running.dtype}, c, 0.0);
    const double rv = param_at(BnParam{running.var, running.dtype}, c, 0.0);
    param_store(running.mean, running.dtype, c, (1.0 - mo) * rm + mo * mu);
    param_store(running.var, running.dtype, c, (1.0 - mo) * rv + mo * var * unbias);
  }
  if (running.count != nullptr && c == 0) *running.count += 1;
}

// One warp: channel c's statistics from the partial sums of (x - k) and (x - k)^2 (lane 0 writes).
HT_DEV void stats_finalize_channel(const double* part, int splits, double k, int64_t C, int64_t M, double eps,
                                   const BnRunning& running, double* mean, double* invstd, int64_t c) {
  double a1, a2;
  finalize_sums(part, splits, C, c, a1, a2);
  if (threadIdx.x % 32 != 0) return;
  stats_write(a1, a2, k, M, eps, running, mean, invstd, c);
}

// Channel c's backward sums from a1 = sum g', a2 = sum g' * (x - mean) (one thread).
HT_DEV void bwd_write(double a1, double a2, const double* invstd, const BnBackwardSums& out, int64_t c) {
  const double sgx = a2 * invstd[c];
  if (out.sum_g) out.sum_g[c] = a1;
  if (out.sum_gxhat) out.sum_gxhat[c] = sgx;
  if (out.grad_bias.data) param_store(out.grad_bias.data, out.grad_bias.dtype, c, a1);
  if (out.grad_weight.data) param_store(out.grad_weight.data, out.grad_weight.dtype, c, sgx);
}

// One warp: channel c's backward sums (lane 0 writes).
HT_DEV void bwd_finalize_channel(const double* part, int splits, int64_t C, const double* invstd,
                                 const BnBackwardSums& out, int64_t c) {
  double a1, a2;
  finalize_sums(part, splits, C, c, a1, a2);
  if (threadIdx.x % 32 != 0) return;
  bwd_write(a1, a2, invstd, out, c);
}

// ---- backward ------------------------------------------------------------------------------------------

// The mean (mu) and, with a fused activation, the forward's per-channel scale / shift (sc, sh: what
// bn_masked_g recomputes y from) of the V channels col.. , in the compute type A (the channels-last reductions).
template <BnAct Act, class A, int V>
HT_DEV void bn_channel_consts(const BnChannels& ch, int64_t col, A (&mu)[V], A (&sc)[V], A (&sh)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mu[j] = static_cast<A>(ch.mean[col + j]);
    if constexpr (Act != BnAct::none) {
      double a, b;
      affine_of(ch, col + j, a, b);
      sc[j] = static_cast<A>(a);
      sh[j] = static_cast<A>(b);
    }
  }
}

// One element: with g' = the masked g, gx = g' * a + ((x - m) * b + k) (train) or g' * a (eval); the
// residual's gradient (add_relu) is g'.
template <BnAct Act, class T, class A>
HT_DEV void dx_elem(BnMode mode, T gv, T xv, T rv, A ca, A cb, A ck, A cm, A sc, A sh, T& gx, T& gres) {
  const A x = convert<A>(xv);
  const A gm = bn_masked_g<Act, T>(convert<A>(gv), x, sc, sh, rv);
  gx = mode == BnMode::train ? bn_store<T>(gm * ca + ((x - cm) * cb + ck)) : bn_store<T>(gm * ca);
  if constexpr (Act == BnAct::add_relu) gres = bn_store<T>(gm);
}

template <BnAct Act, class T, int V, bool VS = false>
HT_DEV void store_res_grad(const BnChannels& ch, int64_t o, const Pack<T, V>& v) {
  if constexpr (Act == BnAct::add_relu) cf_store<VS, T, V>(static_cast<T*>(ch.residual_grad) + o, v);
}

}  // namespace ht::kernels::bn
